"""The fuzz's tensors: inputs placed in a layout (contig, strided, transposed, rows) with a guard
on the memory around a view, on the device pycoll's tensors live on, and comparisons of results
(bitwise, by value, or within a bound), on CPU whatever device a result is on.
"""

import torch

from reference import gen


def place(values, layout, seed=987654321, device="cpu"):
    """A tensor on `device` holding `values` (a CPU tensor) in `layout`, plus a
    guard: the memory around a strided view, which no op may touch (None for
    other layouts).
      contig:     a fresh contiguous tensor;
      strided:    every other element of a 2n buffer (1-D values);
      transposed: the transpose of a (b, a) tensor (2-D values);
      rows:       columns 1:1+c of a (r, c + 2) buffer (2-D values)."""
    if layout == "contig":
        return values.to(device, copy=True), None
    if layout == "strided":
        n = values.numel()
        base = gen(values.dtype, "data", (2 * n,), seed + n).to(device)
        view = base[::2]
        view.copy_(values)
        return view, (base, [base[1::2].clone()], lambda b: [b[1::2]])
    if layout == "transposed":
        a, b = values.shape
        t = torch.empty((b, a), dtype=values.dtype, device=device).t()
        t.copy_(values)
        return t, None
    if layout == "rows":
        r, c = values.shape
        base = gen(values.dtype, "data", (r, c + 2), seed + r).to(device)
        view = base[:, 1:1 + c]
        view.copy_(values)
        return view, (base, [base[:, 0].clone(), base[:, c + 1].clone()],
                      lambda b: [b[:, 0], b[:, c + 1]])
    raise ValueError(layout)


def gloo_has(op):
    """Gloo rejects PREMUL_SUM ("Cannot use ReduceOp.PREMUL_SUM with Gloo")."""
    return op != "PREMUL_SUM"


def as_bytes(t):
    """`t`'s bytes, on CPU (a tensor on a GPU is copied)."""
    flat = t.detach().cpu().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # e.g. one element of a strided view
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8)


def compare(got, ref, bound=None, bitwise=False):
    """None when `got` matches `ref`, else a message with the first bad element.
    bitwise: the bytes must match (data movement); bound None: values equal;
    else |got - ref| <= bound (ref float64).  Either side may be on a GPU: both
    are compared on CPU."""
    got, ref = got.cpu(), ref.cpu()
    if tuple(got.shape) != tuple(ref.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    if bound is None and got.dtype != ref.dtype:
        return f"dtype {got.dtype}, expected {ref.dtype}"
    if got.numel() == 0:
        return None
    g = got.reshape(-1)
    r = ref.reshape(-1)
    if bitwise:
        gb, rb = as_bytes(g), as_bytes(r)
        if torch.equal(gb, rb):
            return None
        bad = ((gb != rb).nonzero() // g.element_size()).unique()
    elif bound is None:
        if torch.equal(g, r):
            return None
        bad = (g != r).nonzero()
    else:
        b = bound.reshape(-1) if isinstance(bound, torch.Tensor) else torch.full_like(r, bound)
        err = (g.double() - r).abs()
        bad_mask = ~(err <= b)  # NaN counts as bad
        if not bad_mask.any():
            return None
        bad = bad_mask.nonzero()
        i = int(bad[0])
        return (f"{bad.numel()} of {g.numel()} elements out of tolerance; first at flat index "
                f"{i}: got {g[i].item()!r}, expected {r[i].item()!r} +- {b[i].item():.3g} "
                f"(max error {err.max().item():.3g})")
    i = int(bad.reshape(-1)[0])
    return (f"{bad.numel()} of {g.numel()} elements differ; first at flat index {i}: "
            f"got {g[i].item()!r}, expected {r[i].item()!r}")

"""The compression kernels (pycollectives.hooks._kernels) against plain torch.

Three layers are checked:
  * the plain-torch reference (``ref_*``) against an obvious per-element
    definition, so that the reference itself is right;
  * the dispatching functions (native ``pycollectives._C`` kernels when the
    extension has them, else the reference) against the reference:
    bit-exact for the sign functions and the copies, to a float tolerance for
    Gram-Schmidt;
  * the native kernels directly (skipped until the extension is rebuilt with
    them; on CUDA marked ``gpu``).
Single process; no ranks.
"""
import itertools
import math

import pytest
import torch

from pycollectives.hooks import _kernels as K

NATIVE = K.native_available()
needs_native = pytest.mark.skipif(not NATIVE, reason="pycollectives._C has no compression kernels (rebuild)")

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
SIZES = [0, 1, 31, 32, 33, 1000, 65537]


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        devs.append("cuda")
    return devs


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def signs_input(n, dtype, seed):
    """Random values with the special cases sprinkled in: 0, -0.0, NaN, tiny negatives."""
    x = torch.randn(n, generator=_gen(seed), dtype=torch.float64)
    special = torch.tensor([0.0, -0.0, float("nan"), -1e-30, 1e-30, -float("inf"), float("inf")], dtype=torch.float64)
    k = min(n, special.numel())
    if k:
        idx = torch.randperm(n, generator=_gen(seed + 1))[:k]
        x[idx] = special[:k]
    return x.to(dtype)


def obvious_pack(x):
    """Per element: bit i % 32 of word i // 32 is 1 when x[i] < 0."""
    vals = x.reshape(-1).tolist()
    words = [0] * ((len(vals) + 31) // 32)
    for i, v in enumerate(vals):
        if v < 0:
            words[i // 32] |= 1 << (i % 32)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


# ---------------------------------------------------------------------------
# the reference is right


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 100])
def test_reference_pack_matches_definition(n, dtype, seed):
    x = signs_input(n, dtype, seed)
    assert torch.equal(K.ref_pack_signs(x), obvious_pack(x))


def test_reference_unpack_and_vote_match_definition(seed):
    n, world = 77, 4
    xs = [signs_input(n, torch.float32, seed + r) for r in range(world)]
    packed = torch.stack([obvious_pack(x) for x in xs])
    for r in range(world):
        want = torch.tensor([-2.5 if v < 0 else 2.5 for v in xs[r].tolist()])
        assert torch.equal(K.ref_unpack_signs(packed[r], n, 2.5), want)
    want = []
    for i in range(n):
        neg = sum(1 for r in range(world) if xs[r][i].item() < 0)
        want.append(0.5 * (1 if neg < world - neg else -1 if neg > world - neg else 0))
    assert torch.equal(K.ref_majority_vote(packed, n, 0.5), torch.tensor(want))


def test_reference_gram_schmidt_is_qr(seed):
    a = torch.randn(5, 40, 6, generator=_gen(seed), dtype=torch.float64)
    q = K.ref_batched_orthogonalize_(a.clone(), eps=0.0)
    qr, r = torch.linalg.qr(a)
    # QR is unique up to the sign of each column.
    assert torch.allclose(q, qr * torch.sign(torch.diagonal(r, dim1=1, dim2=2)).unsqueeze(1), atol=1e-10)


# ---------------------------------------------------------------------------
# dispatching functions (native when built) == reference


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", FLOATS)
def test_pack_unpack_bit_exact(device, dtype, seed):
    for n in SIZES:
        x = signs_input(n, dtype, seed + n).to(device)
        packed = K.pack_signs(x)
        assert packed.dtype == torch.int32 and packed.shape == (K.sign_words(n),)
        assert torch.equal(packed.cpu(), K.ref_pack_signs(x.cpu())), f"n={n}"
        out = K.unpack_signs(packed, n, 0.25)
        assert out.dtype == torch.float32 and out.shape == (n,)
        assert torch.equal(out.cpu(), K.ref_unpack_signs(packed.cpu(), n, 0.25)), f"n={n}"
        # round trip: sign(x) with sign(0) = sign(NaN) = +
        want = torch.where(x.float() < 0, -0.25, 0.25).cpu()
        assert torch.equal(out.cpu(), want)
        buf = torch.full((n,), 9.0, device=device)
        assert K.unpack_signs(packed, n, 0.25, out=buf) is buf and torch.equal(buf.cpu(), want)


@pytest.mark.parametrize("device", _devices())
def test_pack_non_contiguous_and_2d(device, seed):
    x = torch.randn(70, 90, generator=_gen(seed)).to(device)
    assert torch.equal(K.pack_signs(x).cpu(), K.ref_pack_signs(x.cpu()))
    xt = x.t()  # not contiguous: packed in row-major order of the view
    assert torch.equal(K.pack_signs(xt).cpu(), K.ref_pack_signs(xt.contiguous().cpu()))


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_majority_vote_bit_exact(device, world, seed):
    for n in SIZES:
        rows = torch.stack([K.ref_pack_signs(signs_input(n, torch.float32, seed + 17 * r + n)) for r in range(world)])
        rows = rows.to(device)
        got = K.majority_vote(rows, n, 1.5)
        assert torch.equal(got.cpu(), K.ref_majority_vote(rows.cpu(), n, 1.5)), f"world={world} n={n}"
        buf = torch.full((n,), 9.0, device=device)
        assert K.majority_vote(rows, n, 1.5, out=buf) is buf and torch.equal(buf, got)
        # a row stride larger than the words (the hook's [words | scale] rows)
        padded = torch.cat([rows, torch.full((world, 3), -1, dtype=torch.int32, device=device)], dim=1)
        assert torch.equal(K.majority_vote(padded[:, : rows.shape[1]], n, 1.5).cpu(), got.cpu())


def test_majority_vote_ties_are_zero():
    a = K.ref_pack_signs(torch.tensor([1.0, -1.0, 1.0, -1.0]))
    b = K.ref_pack_signs(torch.tensor([1.0, -1.0, -1.0, 1.0]))
    got = K.majority_vote(torch.stack([a, b]), 4)
    assert got.tolist() == [1.0, -1.0, 0.0, 0.0]


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12), (torch.bfloat16, 5e-2),
                                       (torch.float16, 1e-2)])
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 17, 1), (4, 64, 4), (2, 300, 8), (2, 50, 13), (0, 5, 2)])
def test_orthogonalize_matches_reference(device, dtype, tol, shape, seed):
    a = torch.randn(shape, generator=_gen(seed), dtype=torch.float64).to(dtype).to(device)
    got = K.batched_orthogonalize_(a.clone(), 1e-8)
    want = K.ref_batched_orthogonalize_(a.clone().double().cpu(), 1e-8)
    assert torch.allclose(got.double().cpu(), want, atol=tol * 10, rtol=tol * 10)
    if shape[0] and dtype in (torch.float32, torch.float64):
        # orthonormal columns (with eps = 0: eps shortens a column of norm c by eps / c)
        q = K.batched_orthogonalize_(a.clone(), 0.0).double().cpu()
        eye = torch.eye(shape[2], dtype=torch.float64)
        gram = q.transpose(1, 2) @ q
        assert torch.allclose(gram, eye.expand_as(gram), atol=tol * 10)


@pytest.mark.parametrize("device", _devices())
def test_orthogonalize_strided_and_zero_columns(device, seed):
    base = torch.randn(3, 8, 40, generator=_gen(seed)).to(device)
    view = base.transpose(1, 2)[:, :, :5]  # [3, 40, 5], not contiguous
    want = K.ref_batched_orthogonalize_(view.clone().cpu(), 1e-8)
    K.batched_orthogonalize_(view, 1e-8)
    assert torch.allclose(view.cpu(), want, atol=1e-5)
    z = torch.zeros(2, 10, 3, device=device)
    z[1, :, 1] = torch.arange(10.0)
    for eps in (0.0, 1e-8):
        out = K.batched_orthogonalize_(z.clone(), eps)
        assert torch.isfinite(out).all()
        assert torch.count_nonzero(out[0]) == 0  # all-zero columns stay 0


def test_orthogonalize_spans_the_columns(seed):
    """Q Q^T A = A: Gram-Schmidt keeps the column space (what PowerSGD relies on)."""
    a = torch.randn(6, 50, 4, generator=_gen(seed), dtype=torch.float64)
    q = K.batched_orthogonalize_(a.clone(), 0.0)
    assert torch.allclose(q @ (q.transpose(1, 2) @ a), a, atol=1e-10)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8])
def test_flatten_unflatten_round_trip(device, dtype, seed):
    g = _gen(seed)
    shapes = [(3, 4), (0,), (1,), (1000,), (17, 33), (5, 1, 7), (70000,)]
    ts = [(torch.randn(s, generator=g) * 100).to(dtype).to(device) for s in shapes]
    ts[4] = ts[4].t()  # a non-contiguous one
    total = sum(t.numel() for t in ts)
    bucket = torch.full((total + 5,), 7, dtype=dtype, device=device)
    K.flatten_into(ts, bucket)
    want = torch.cat([t.reshape(-1) for t in ts])
    assert torch.equal(bucket[:total], want)
    assert torch.equal(bucket[total:], torch.full((5,), 7, dtype=dtype, device=device))  # the tail is untouched
    outs = [torch.zeros_like(t) for t in ts]
    outs[4] = torch.zeros(ts[4].shape[::-1], dtype=dtype, device=device).t()
    K.unflatten_from(bucket, outs)
    for a, b in zip(outs, ts):
        assert torch.equal(a, b)


def test_flatten_in_place_views():
    """Gradients that already are views of the bucket (DDP's gradient views) are left as they are."""
    bucket = torch.arange(10.0)
    views = [bucket[:4].view(2, 2), bucket[4:]]
    K.flatten_into(views, bucket)
    K.unflatten_from(bucket, views)
    assert torch.equal(bucket, torch.arange(10.0))


# ---------------------------------------------------------------------------
# bad arguments: the same errors from native and reference


@pytest.mark.parametrize("impl", ["dispatch", "ref", pytest.param("native", marks=needs_native)])
def test_bad_arguments(impl):
    """The same exception types and messages from the Python checks and from the native ones."""
    names = ("pack_signs", "unpack_signs", "majority_vote", "batched_orthogonalize_", "flatten_into",
             "unflatten_from")
    if impl == "dispatch":
        f = K
    elif impl == "ref":
        f = type("R", (), {n: staticmethod(getattr(K, "ref_" + n)) for n in names})
    else:  # the extension itself: its own checks, exceptions thrown with the GIL held
        f = type("N", (), {n: staticmethod(getattr(K._native_module, n)) for n in names})
    with pytest.raises(TypeError, match="pack_signs"):
        f.pack_signs(torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="int32"):
        f.unpack_signs(torch.ones(3), 3)
    with pytest.raises(ValueError, match="words"):
        f.unpack_signs(torch.zeros(1, dtype=torch.int32), 33)
    with pytest.raises(ValueError, match="world, words"):
        f.majority_vote(torch.zeros(4, dtype=torch.int32), 3)
    with pytest.raises(TypeError):
        f.batched_orthogonalize_(torch.zeros(1, 4, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="r <= n"):
        f.batched_orthogonalize_(torch.zeros(1, 2, 4))
    with pytest.raises(TypeError, match="tensors\\[1\\]"):
        f.flatten_into([torch.zeros(2), torch.zeros(2, dtype=torch.float64)], torch.zeros(4))
    with pytest.raises(ValueError, match="bucket only"):
        f.unflatten_from(torch.zeros(3), [torch.zeros(2), torch.zeros(2)])
    with pytest.raises(TypeError, match="out must be float32"):
        f.unpack_signs(torch.zeros(1, dtype=torch.int32), 5, 1.0, torch.zeros(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="out must be contiguous with 5"):
        f.majority_vote(torch.zeros(2, 1, dtype=torch.int32), 5, 1.0, torch.zeros(6))


# ---------------------------------------------------------------------------
# the native kernels themselves (after the rebuild)


@needs_native
def test_native_kernels_are_used():
    import pycollectives

    for name in ("pack_signs", "unpack_signs", "majority_vote", "batched_orthogonalize_", "flatten_into",
                 "unflatten_from"):
        assert callable(getattr(pycollectives._C, name))
    x = torch.randn(1000)
    assert torch.equal(pycollectives._C.pack_signs(x), K.ref_pack_signs(x))


@pytest.mark.gpu
@pytest.mark.shares_gpus  # one process: one GPU is enough
@needs_native
def test_native_cuda_kernels_large():
    """64 MiB of float32 on the GPU: pack / unpack / vote / copies bit-exact vs the reference on the CPU."""
    import pycollectives

    if not pycollectives.cuda_built():
        pytest.skip("CPU-only build")
    n = 16 << 20
    x = torch.randn(n, device="cuda")
    packed = K.pack_signs(x)
    assert torch.equal(packed.cpu(), K.ref_pack_signs(x.cpu()))
    assert torch.equal(K.unpack_signs(packed, n, 3.0).cpu(), K.ref_unpack_signs(packed.cpu(), n, 3.0))
    rows = torch.stack([packed, K.pack_signs(-x), K.pack_signs(torch.randn(n, device="cuda"))])
    assert torch.equal(K.majority_vote(rows, n).cpu(), K.ref_majority_vote(rows.cpu(), n))
    ts = [torch.randn(s, device="cuda") for s in (4097, 1 << 20, 3, 999_999)]
    bucket = torch.empty(sum(t.numel() for t in ts), device="cuda")
    K.flatten_into(ts, bucket)
    assert torch.equal(bucket, torch.cat(ts))
    m = torch.randn(64, 1024, 4, device="cuda")
    assert torch.allclose(K.batched_orthogonalize_(m.clone()).cpu(), K.ref_batched_orthogonalize_(m.cpu()),
                          atol=1e-4)
    assert math.isfinite(float(bucket.sum()))


# ---------------------------------------------------------------------------
# the signSGD hook's fused CPU kernels, against their plain compositions

FUSED_LAYOUTS = [
    [1], [31], [32], [33], [1000], [65537],
    [5, 27, 0, 64, 1, 31, 33],            # boundaries inside words, an empty segment, a 1-element one
    [32, 32, 0, 0, 64],                   # boundaries on words
    [4096 * 32 + 7, 3, 40000, 129],       # long runs of whole words (the vector path) and tails
]


@pytest.mark.skipif(not K.signsgd_fast_path(torch.zeros(1)), reason="extension without the fused signSGD kernels")
@pytest.mark.parametrize("sizes", FUSED_LAYOUTS, ids=lambda s: "-".join(map(str, s)))
def test_fused_signsgd_kernels_match_compositions(sizes, seed):
    n = sum(sizes)
    ends = list(itertools.accumulate(sizes))
    torch.manual_seed(seed)
    e = torch.randn(n) * 0.1
    e[::7] = 0.0
    e[::11] = -0.0
    g = torch.randn(n)
    for with_g in (True, False):
        mine, ref = e.clone(), e.clone()
        words, l1 = K.signsgd_encode_(mine, g if with_g else None, ends)
        rwords, rl1 = K.ref_signsgd_encode_(ref, g if with_g else None, ends)
        assert torch.equal(mine, ref), "e += g"
        assert torch.equal(words, rwords), "sign words"
        assert l1.dtype == torch.float64 and l1.shape == (len(sizes),)
        torch.testing.assert_close(l1, rl1, rtol=1e-6, atol=1e-9)
    scales = (torch.rand(len(sizes)) + 0.5).to(torch.float32)
    a, b = mine.clone(), mine.clone()
    K.signsgd_sub_signs_(a, words, ends, scales)
    K.ref_signsgd_sub_signs_(b, words, ends, scales)
    assert torch.equal(a, b), "residual"
    for world in (1, 2, 3, 4):
        rows = torch.stack([K.ref_pack_signs(torch.randn(n)) for _ in range(world)])
        got = K.majority_vote_segments(rows, n, ends, scales, out=torch.full((n,), 7.0))
        want = K.ref_majority_vote_segments(rows, n, ends, scales, out=torch.full((n,), 9.0))
        assert torch.equal(got, want), f"vote, world {world}"


@pytest.mark.skipif(not K.signsgd_fast_path(torch.zeros(1)), reason="extension without the fused signSGD kernels")
def test_fused_signsgd_kernels_reject_bad_input():
    f = K._native_module
    with pytest.raises(TypeError, match="float32"):
        f.signsgd_encode_(torch.zeros(4, dtype=torch.float64), None, [4])
    with pytest.raises(ValueError, match="last segment end"):
        f.signsgd_encode_(torch.zeros(4), None, [3])
    with pytest.raises(ValueError, match="non-decreasing"):
        f.signsgd_encode_(torch.zeros(4), None, [3, 2, 4])
    with pytest.raises(ValueError, match="g has 5 elements"):
        f.signsgd_encode_(torch.zeros(4), torch.zeros(5), [4])
    with pytest.raises(ValueError, match="one per segment"):
        f.signsgd_sub_signs_(torch.zeros(4), torch.zeros(1, dtype=torch.int32), [1, 4], torch.ones(1))
    with pytest.raises(ValueError, match="out has"):
        f.majority_vote_segments(torch.zeros(2, 1, dtype=torch.int32), 4, [4], torch.ones(1), torch.zeros(5))

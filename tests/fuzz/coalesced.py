"""The fuzz's coalesced ops: _coalescing_manager with all_reduce, all_gather_into_tensor or
reduce_scatter_tensor, and dist.all_reduce_coalesced.
"""

import torch.distributed as dist

from reference import dist_op, filler, name

from .tensors import gloo_has


class CoalescedOps:
    """The coalesced ops of Fuzzer, a mixin (the op_<kind> contract: core.py)."""

    def op_coalesced(self, grp):
        W = grp.size
        form = self.rng.choice(["all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
                                "reduce_scatter_tensor"])
        k = self.rng.randint(1, 5)
        reduces = form in ("all_reduce", "all_reduce_coalesced", "reduce_scatter_tensor")
        if reduces:  # one dtype and one reduce op per batch
            dtype = self.dtype()
            dtypes = [dtype] * k
            op, factor = self.redop(dtype)
        else:
            dtypes = [self.dtype() for _ in range(k)]
            op, factor = None, None
        mult = W * k if form != "all_reduce" and form != "all_reduce_coalesced" else k
        sizes = [self.numel(d, mult=mult) for d in dtypes]
        a = self.is_async()
        how = "dist.all_reduce_coalesced" if form == "all_reduce_coalesced" else \
            f"_coalescing_manager: {k} x {form}"
        desc = (f"coalesced {how} {[name(d) for d in dtypes] if not reduces else name(dtypes[0])}"
                f"{' ' + op if op else ''} sizes={sizes}{' async' if a else ''}")

        def run():
            xs = [self._data(d, op or "data", (n * (W if form == "reduce_scatter_tensor" else 1),), k=i)
                  for i, (d, n) in enumerate(zip(dtypes, sizes))]
            refs, gath = [None] * k, [None] * k
            if self.check:  # Gloo: one op per tensor
                for i, (d, n) in enumerate(zip(dtypes, sizes)):
                    if form in ("all_reduce", "all_reduce_coalesced"):
                        if gloo_has(op):
                            refs[i] = xs[i].clone()
                            dist.all_reduce(refs[i], op=dist_op(op), group=grp.ref)
                    elif form == "reduce_scatter_tensor":
                        if gloo_has(op):
                            refs[i] = filler(d, (n,))
                            dist.reduce_scatter_tensor(refs[i], xs[i].clone(), op=dist_op(op),
                                                       group=grp.ref)
                    else:
                        refs[i] = filler(d, (W * n,))
                        dist.all_gather_into_tensor(refs[i], xs[i].clone(), group=grp.ref)
                    if reduces and (d.is_floating_point or refs[i] is None):
                        gath[i] = self.gathered(grp, xs[i])
            if form == "all_reduce_coalesced":
                outs = [self.dev_copy(x) for x in xs]
                w = dist.all_reduce_coalesced(outs, op=dist_op(op, factor), group=grp.pg, async_op=a)
            else:
                if form == "all_reduce":
                    outs = [self.dev_copy(x) for x in xs]
                elif form == "reduce_scatter_tensor":
                    outs = [self.dev(filler(d, (n,))) for d, n in zip(dtypes, sizes)]
                else:
                    outs = [self.dev(filler(d, (W * n,))) for d, n in zip(dtypes, sizes)]
                # The pair forms' inputs (on CPU, xs themselves); all_reduce works in place on outs.
                ins = [self.dev(x) for x in xs] if form != "all_reduce" else None
                with dist._coalescing_manager(group=grp.pg, async_ops=a) as cm:
                    for i in range(k):
                        if form == "all_reduce":
                            dist.all_reduce(outs[i], op=dist_op(op, factor), group=grp.pg)
                        elif form == "reduce_scatter_tensor":
                            dist.reduce_scatter_tensor(outs[i], ins[i], op=dist_op(op, factor),
                                                       group=grp.pg)
                        else:
                            dist.all_gather_into_tensor(outs[i], ins[i], group=grp.pg)
                w = cm if a else None

            def finish():
                if not self.check:
                    return
                for i, (d, n) in enumerate(zip(dtypes, sizes)):
                    if form == "all_gather_into_tensor":
                        self.expect(f"output {i} vs gloo", outs[i], refs[i], bitwise=True)
                    elif form == "reduce_scatter_tensor":
                        mine = slice(grp.me * n, (grp.me + 1) * n)
                        self.check_reduced(f"output {i}", outs[i], refs[i], gath[i], op, d, factor,
                                           part=mine)
                    else:
                        self.check_reduced(f"tensor {i}", outs[i], refs[i], gath[i], op, d, factor)
                        self.check_identical(grp, f"tensor {i}", outs[i])
            return w, finish
        return desc, a, run

"""The fuzz's reducing ops: all_reduce (sync, async, through its Future), reduce, reduce_scatter
(list) and reduce_scatter_tensor (flat or stacked input).
"""

import torch.distributed as dist

from reference import dist_op, filler, name

from .tensors import gloo_has, place


class ReductionOps:
    """The reducing ops of Fuzzer, a mixin (the op_<kind> contract: core.py)."""

    def op_all_reduce(self, grp):
        dtype = self.dtype()
        op, factor = self.redop(dtype)
        shape, layout = self.shape(dtype, transposed=True)
        a = self.is_async()
        use_future = a and self.rng.random() < 0.3
        desc = (f"all_reduce {name(dtype)} {op} shape={shape} {layout}"
                f"{' async' if a else ''}{' (future)' if use_future else ''}")

        def run():
            x = self._data(dtype, op, shape)
            t, guard = place(x, layout, device=self.device)
            gloo_t = xs = None
            if self.check:
                if gloo_has(op):
                    gloo_t = x.clone()
                    dist.all_reduce(gloo_t, op=dist_op(op), group=grp.ref)
                if dtype.is_floating_point or gloo_t is None:
                    xs = self.gathered(grp, x)
            w = dist.all_reduce(t, op=dist_op(op, factor), group=grp.pg, async_op=a)
            if not a and w is not None:
                self.fail("return value", f"sync all_reduce returned {w!r}, not None")
            fut = w.get_future() if use_future else None

            def finish():
                if fut is not None:  # DDP's path: the Work's Future, not Work.wait()
                    val = fut.wait()
                    if not (isinstance(val, list) and len(val) == 1):
                        self.fail("future", f"value is not a list of one tensor: {type(val)}")
                    else:
                        self.expect("future value", val[0], t, bitwise=True)
                elif a and not self.is_completed(w):
                    self.fail("work", "is_completed() is False after wait()")
                if self.check:
                    self.check_reduced("result", t, gloo_t, xs, op, dtype, factor)
                    self.check_identical(grp, "result", t)
                self.check_guard(guard)
            return (None if use_future else w), finish
        return desc, a, run

    def op_reduce(self, grp):
        dtype = self.dtype()
        op, factor = self.redop(dtype)
        shape, layout = self.shape(dtype, transposed=True)
        root = self.rng.randrange(grp.size)
        a = self.is_async()
        desc = f"reduce {name(dtype)} {op} shape={shape} {layout} root={grp.g(root)}{' async' if a else ''}"

        def run():
            x = self._data(dtype, op, shape)
            t, guard = place(x, layout, device=self.device)
            gloo_t = xs = None
            if self.check:
                if gloo_has(op):
                    gloo_t = x.clone()
                    dist.reduce(gloo_t, dst=grp.g(root), op=dist_op(op), group=grp.ref)
                if dtype.is_floating_point or gloo_t is None:
                    xs = self.gathered(grp, x)
            w = dist.reduce(t, dst=grp.g(root), op=dist_op(op, factor), group=grp.pg, async_op=a)

            def finish():
                if self.check and grp.me == root:
                    self.check_reduced("result on root", t, gloo_t, xs, op, dtype, factor)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def _reduce_scatter(self, grp, form):
        dtype = self.dtype()
        op, factor = self.redop(dtype)
        (n,), layout = self.shape(dtype, mult=grp.size)
        stacked = form == "tensor" and self.rng.random() < 0.3
        a = self.is_async()
        what = "reduce_scatter (list)" if form == "list" else \
            f"reduce_scatter_tensor {'stacked (W, n)' if stacked else 'flat (W*n)'} input"
        desc = f"{what} {name(dtype)} {op} n={n} {layout}{' async' if a else ''}"
        W = grp.size

        def run():
            x = self._data(dtype, op, (W * n,))
            buf, guard = place(x, layout, device=self.device)
            gloo_out = xs = None
            if self.check:
                if gloo_has(op):
                    gloo_out = filler(dtype, (n,))
                    if form == "list":
                        dist.reduce_scatter(gloo_out, [c.clone() for c in x.split(n)] if n else
                                            [x.clone() for _ in range(W)],
                                            op=dist_op(op), group=grp.ref)
                    else:
                        dist.reduce_scatter_tensor(gloo_out, x.clone(), op=dist_op(op), group=grp.ref)
                if dtype.is_floating_point or gloo_out is None:
                    xs = self.gathered(grp, x)
            out = self.dev(filler(dtype, (n,)))
            if form == "list":
                chunks = [buf[j * n:(j + 1) * n] for j in range(W)]
                w = dist.reduce_scatter(out, chunks, op=dist_op(op, factor), group=grp.pg, async_op=a)
            else:
                w = dist.reduce_scatter_tensor(out, buf.view(W, n) if stacked else buf,
                                               op=dist_op(op, factor), group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    mine = slice(grp.me * n, (grp.me + 1) * n)
                    self.check_reduced("output", out, gloo_out, xs, op, dtype, factor, part=mine)
                self.expect("input unchanged", buf, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_reduce_scatter(self, grp):
        return self._reduce_scatter(grp, "list")

    def op_reduce_scatter_tensor(self, grp):
        return self._reduce_scatter(grp, "tensor")

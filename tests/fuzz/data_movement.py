"""The fuzz's data-movement ops: broadcast, all_gather (list and into a tensor), all_to_all
(even or uneven lists), all_to_all_single (even, uneven, strided rows), gather, scatter, barrier.
"""

import torch.distributed as dist

from reference import filler, name

from .tensors import place

# Some torch versions' Gloo has no list all_to_all (torch 2.11: "Backend gloo does not support
# alltoall", raised locally before any communication, so on every rank alike): the even case then
# takes the torch reference, as the uneven one does.
_gloo_all_to_all_list = [True]


class DataMovementOps:
    """The data-movement ops of Fuzzer, a mixin (the op_<kind> contract: core.py)."""

    def op_broadcast(self, grp):
        dtype = self.dtype()
        shape, layout = self.shape(dtype, transposed=True)
        root = self.rng.randrange(grp.size)
        a = self.is_async()
        desc = f"broadcast {name(dtype)} shape={shape} {layout} root={grp.g(root)}{' async' if a else ''}"

        def run():
            x = self._data(dtype, "data", shape)
            t, guard = place(x, layout, device=self.device)
            gloo_t = None
            if self.check:
                gloo_t = x.clone()
                dist.broadcast(gloo_t, src=grp.g(root), group=grp.ref)
            w = dist.broadcast(t, src=grp.g(root), group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    self.expect("result vs gloo", t, gloo_t, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_all_gather(self, grp):
        dtype = self.dtype()
        shape, layout = self.shape(dtype, mult=grp.size, transposed=True)
        a = self.is_async()
        desc = f"all_gather (list) {name(dtype)} shape={shape} {layout}{' async' if a else ''}"

        def run():
            x = self._data(dtype, "data", shape)
            inp, guard = place(x, layout, device=self.device)
            refs = None
            if self.check:
                refs = [filler(dtype, shape) for _ in range(grp.size)]
                dist.all_gather(refs, x.clone(), group=grp.ref)
            outs = [self.dev(filler(dtype, shape)) for _ in range(grp.size)]
            w = dist.all_gather(outs, inp, group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    for r in range(grp.size):
                        self.expect(f"output[{r}] vs gloo", outs[r], refs[r], bitwise=True)
                self.expect("input unchanged", inp, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_all_gather_into_tensor(self, grp):
        dtype = self.dtype()
        (n,), layout = self.shape(dtype, mult=grp.size)
        stacked = self.rng.random() < 0.3
        a = self.is_async()
        desc = (f"all_gather_into_tensor {name(dtype)} n={n} {layout} "
                f"{'stacked (W, n)' if stacked else 'flat (W*n)'} output{' async' if a else ''}")

        def run():
            x = self._data(dtype, "data", (n,))
            inp, guard = place(x, layout, device=self.device)
            ref = None
            if self.check:  # Gloo: flat output only
                ref = filler(dtype, (grp.size * n,))
                dist.all_gather_into_tensor(ref, x.clone(), group=grp.ref)
            out = self.dev(filler(dtype, (grp.size, n) if stacked else (grp.size * n,)))
            w = dist.all_gather_into_tensor(out, inp, group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    self.expect("output vs gloo", out.reshape(-1), ref, bitwise=True)
                self.expect("input unchanged", inp, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_all_to_all(self, grp):
        dtype = self.dtype()
        W = grp.size
        uneven = self.rng.random() < 0.5
        n = self.numel(dtype, mult=W * W)
        S = self.split_matrix(W, n) if uneven else [[n] * W for _ in range(W)]
        a = self.is_async()
        desc = (f"all_to_all (list) {name(dtype)} "
                f"{'uneven splits ' + str(S) if uneven else f'even n={n}'}{' async' if a else ''}")

        def run():
            me = grp.me
            x = self._data(dtype, "data", (sum(S[me]),))
            ins = [self.dev_copy(c) for c in x.split(S[me])]
            want = None
            if self.check:
                if not uneven and _gloo_all_to_all_list[0]:  # Gloo: equal sizes only ("invalid tensor size")
                    want = [filler(dtype, (S[j][me],)) for j in range(W)]
                    try:
                        dist.all_to_all(want, [c.clone() for c in x.split(S[me])], group=grp.ref)
                    except RuntimeError as e:
                        if "does not support" not in str(e):
                            raise
                        _gloo_all_to_all_list[0] = False
                        want = None
                if want is None:  # torch: slice every rank's input, all_gathered through Gloo
                    xs = self.gathered_uneven(grp, x, [sum(S[r]) for r in range(W)])
                    want = [xs[j][sum(S[j][:me]):sum(S[j][:me + 1])] for j in range(W)]
            outs = [self.dev(filler(dtype, (S[j][me],))) for j in range(W)]
            w = dist.all_to_all(outs, ins, group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    for j in range(W):
                        self.expect(f"output[{j}] vs {'torch' if uneven else 'gloo'}",
                                    outs[j], want[j], bitwise=True)
                for j, c in enumerate(x.split(S[me])):
                    self.expect(f"input[{j}] unchanged", ins[j], c, bitwise=True)
            return w, finish
        return desc, a, run

    def op_all_to_all_single(self, grp):
        dtype = self.dtype()
        W = grp.size
        form = self.rng.choice(["even", "even splits", "uneven", "rows"])
        n = self.numel(dtype, mult=W * W * (3 if form == "rows" else 1))
        S = self.split_matrix(W, n) if form in ("uneven", "rows") and self.rng.random() < 0.7 \
            else [[n] * W for _ in range(W)]
        a = self.is_async()
        desc = (f"all_to_all_single {name(dtype)} {form} "
                f"{('splits ' + str(S)) if S[0][0] != n or len(set(sum(S, []))) > 1 else f'n={n}'}"
                f"{' (rows of 3, strided input)' if form == 'rows' else ''}{' async' if a else ''}")

        def run():
            me = grp.me
            cols = (3,) if form == "rows" else ()
            x = self._data(dtype, "data", (sum(S[me]),) + cols)
            inp, guard = place(x, "rows" if form == "rows" else "contig", device=self.device)
            out_rows = sum(S[j][me] for j in range(W))
            splits = {} if form == "even" else {
                "output_split_sizes": [S[j][me] for j in range(W)],
                "input_split_sizes": list(S[me])}
            ref = None
            if self.check:
                ref = filler(dtype, (out_rows,) + cols)
                dist.all_to_all_single(ref, x.clone(), group=grp.ref, **splits)
            out = self.dev(filler(dtype, (out_rows,) + cols))
            w = dist.all_to_all_single(out, inp, group=grp.pg, async_op=a, **splits)

            def finish():
                if self.check:
                    self.expect("output vs gloo", out, ref, bitwise=True)
                self.expect("input unchanged", inp, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_gather(self, grp):
        dtype = self.dtype()
        shape, layout = self.shape(dtype, mult=grp.size, transposed=True)
        root = self.rng.randrange(grp.size)
        a = self.is_async()
        desc = f"gather {name(dtype)} shape={shape} {layout} root={grp.g(root)}{' async' if a else ''}"

        def run():
            x = self._data(dtype, "data", shape)
            inp, guard = place(x, layout, device=self.device)
            is_root = grp.me == root
            refs = None
            if self.check:
                refs = [filler(dtype, shape) for _ in range(grp.size)] if is_root else None
                dist.gather(x.clone(), refs, dst=grp.g(root), group=grp.ref)
            outs = [self.dev(filler(dtype, shape)) for _ in range(grp.size)] if is_root else None
            w = dist.gather(inp, outs, dst=grp.g(root), group=grp.pg, async_op=a)

            def finish():
                if self.check and is_root:
                    for r in range(grp.size):
                        self.expect(f"gathered[{r}] vs gloo", outs[r], refs[r], bitwise=True)
                self.expect("input unchanged", inp, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_scatter(self, grp):
        dtype = self.dtype()
        shape, layout = self.shape(dtype, mult=grp.size, transposed=True)
        root = self.rng.randrange(grp.size)
        a = self.is_async()
        desc = (f"scatter {name(dtype)} shape={shape} {layout} output root={grp.g(root)}"
                f"{' async' if a else ''}")

        def run():
            is_root = grp.me == root
            xs = [self._data(dtype, "data", shape, k=r) for r in range(grp.size)] if is_root else None
            ref = None
            if self.check:
                ref = filler(dtype, shape)
                dist.scatter(ref, [x.clone() for x in xs] if is_root else None,
                             src=grp.g(root), group=grp.ref)
            out, guard = place(filler(dtype, shape), layout, device=self.device)
            ins = [self.dev_copy(x) for x in xs] if is_root else None
            w = dist.scatter(out, ins, src=grp.g(root), group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    self.expect("output vs gloo", out, ref, bitwise=True)
                if is_root:
                    for r in range(grp.size):
                        self.expect(f"input[{r}] unchanged", ins[r], xs[r], bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_barrier(self, grp):
        a = self.is_async()
        desc = f"barrier{' async' if a else ''}"

        def run():
            w = dist.barrier(group=grp.pg, async_op=a)

            def finish():
                if a and not self.is_completed(w):
                    self.fail("work", "is_completed() is False after wait()")
            return w, finish
        return desc, a, run

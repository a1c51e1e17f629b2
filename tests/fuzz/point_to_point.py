"""The fuzz's point-to-point ops: send/recv (one way or both ways, blocking or not, tagged) and a
batch_isend_irecv ring (one or both directions).
"""

import torch.distributed as dist

from reference import filler, name

from .tensors import place


class PointToPointOps:
    """The point-to-point ops of Fuzzer, a mixin (the op_<kind> contract: core.py)."""

    def op_send_recv(self, grp):
        W = grp.size
        src = self.rng.randrange(W)
        dst = self.rng.choice([r for r in range(W) if r != src])
        mode = self.rng.choice(["one way", "one way", "exchange"])
        tag = self.rng.randrange(0, 64)
        dtype = self.dtype()
        shape, layout = self.shape(dtype, transposed=True)
        rlayout = self.rng.choice(["contig", layout])
        send_async = self.rng.random() < 0.5
        recv_async = self.rng.random() < 0.5
        a = self.is_async()
        desc = (f"send/recv {mode} {grp.g(src)}{'<->' if mode == 'exchange' else '->'}{grp.g(dst)} "
                f"tag={tag} {name(dtype)} shape={shape} send {layout} recv {rlayout} "
                f"{'isend' if send_async else 'send'}/{'irecv' if recv_async else 'recv'}"
                f"{' async' if a else ''}")

        def run():
            me = grp.me
            if me not in (src, dst):
                return None, None
            peer = grp.g(dst if me == src else src)
            sends = me == src or mode == "exchange"
            recvs = me == dst or mode == "exchange"
            x = self._data(dtype, "data", shape)
            st, sguard = place(x, layout, device=self.device) if sends else (None, None)
            rt, rguard = place(filler(dtype, shape), rlayout, device=self.device) if recvs else (None, None)
            ref = None
            if self.check:
                ref = filler(dtype, shape) if recvs else None
                ws_ = [dist.isend(x.clone(), dst=peer, group=grp.ref, tag=tag)] if sends else []
                if recvs:
                    dist.recv(ref, src=peer, group=grp.ref, tag=tag)
                for w in ws_:
                    w.wait()
            works = []
            if mode == "exchange":  # both isend first, then receive
                works.append(dist.isend(st, dst=peer, group=grp.pg, tag=tag))
                if recv_async or a:
                    works.append(dist.irecv(rt, src=peer, group=grp.pg, tag=tag))
                else:
                    dist.recv(rt, src=peer, group=grp.pg, tag=tag)
            elif sends:
                if send_async or a:
                    works.append(dist.isend(st, dst=peer, group=grp.pg, tag=tag))
                else:
                    dist.send(st, dst=peer, group=grp.pg, tag=tag)
            else:
                if recv_async or a:
                    works.append(dist.irecv(rt, src=peer, group=grp.pg, tag=tag))
                else:
                    dist.recv(rt, src=peer, group=grp.pg, tag=tag)

            def finish():
                if self.check and recvs:
                    self.expect("received vs gloo", rt, ref, bitwise=True)
                if sends:
                    self.expect("sent tensor unchanged", st, x, bitwise=True)
                self.check_guard(sguard)
                self.check_guard(rguard)
            return works, finish
        return desc, a, run

    def op_batch_isend_irecv(self, grp):
        W = grp.size
        both = self.rng.random() < 0.4
        tag = self.rng.randrange(0, 64)
        dtype = self.dtype()
        n = self.numel(dtype, mult=2)
        a = self.is_async()
        desc = (f"batch_isend_irecv ring{' both ways' if both else ''} tag={tag} "
                f"{name(dtype)} n={n}{' async' if a else ''}")

        def run():
            me = grp.me
            nxt, prv = grp.g((me + 1) % W), grp.g((me - 1) % W)
            fwd = self._data(dtype, "data", (n,), k=0)
            bwd = self._data(dtype, "data", (n,), k=1)
            plan = [("send", 0, nxt, tag), ("recv", 0, prv, tag)]
            if both:
                plan += [("send", 1, prv, tag + 1), ("recv", 1, nxt, tag + 1)]

            def ops(pg, sends, bufs):
                out = []
                for kind, j, peer, tg in plan:
                    if kind == "send":
                        out.append(dist.P2POp(dist.isend, sends[j], peer, pg, tg))
                    else:
                        out.append(dist.P2POp(dist.irecv, bufs[j], peer, pg, tg))
                return out

            refs = None
            if self.check:
                refs = [filler(dtype, (n,)), filler(dtype, (n,))]
                for r in dist.batch_isend_irecv(ops(grp.ref, [fwd.clone(), bwd.clone()], refs)):
                    r.wait()
            fwd_t, bwd_t = self.dev(fwd), self.dev(bwd)  # pycoll sends these themselves
            got = [self.dev(filler(dtype, (n,))), self.dev(filler(dtype, (n,)))]
            reqs = dist.batch_isend_irecv(ops(grp.pg, [fwd_t, bwd_t], got))

            def finish():
                if self.check:
                    self.expect("received from prev vs gloo", got[0], refs[0], bitwise=True)
                    if both:
                        self.expect("received from next vs gloo", got[1], refs[1], bitwise=True)
                self.expect("sent tensor unchanged", fwd_t,
                            self._data(dtype, "data", (n,), k=0), bitwise=True)
            return reqs, finish
        return desc, a, run

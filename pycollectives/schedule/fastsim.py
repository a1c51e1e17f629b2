"""The simulator's fast path: a Program simulated from its OpTable in numpy arrays, without the
IR's per-step objects, for programs of one lane per rank whose steps are copies and reductions
(the ring, Rabenseifner, Bruck, the binomial tree, ...) with order="program".

It computes what `simulate._Sim` computes, in two passes over the steps as written:

1. The lowering's depth of every step (`language._Lowering`: one more than the deepest step it
   must follow on its rank, its channel's previous message, its send, receive k - channel_depth
   of its channel), over runs of steps that touch no common chunk and no common channel, each
   run at once. A lane's order is then (depth, program order), as the lowering's.
2. The time of every step, level by level in depth (every dependency goes to a deeper step):
   a step starts when its lane's previous step has finished, its message has arrived and its
   channel has room. This is the event simulation's result as long as no send finds a port
   busy: each port's messages then follow each other in time, in the order the levels give them.
   When one does (a port that serves several senders: Bruck's rounds, NICs of a host, ...),
   the order in which the port serves them matters, and `run` returns the IR instead, built
   from the same arrays (what Program.lower() gives): the event simulation runs it.

Memory: the OpTable's columns, two depths (int16 where they fit) and a channel slot (uint8) per
message, two int32 orders, and per (rank, chunk) two depths: about 30 bytes per message.
"""
from __future__ import annotations

import numpy as np

from . import collectives

_I16 = np.iinfo(np.int16).max
_COPY, _REDUCE = 0, 1


def _by_level(depth, nlev, part=1 << 20):
    """The indices of depth's entries >= 0 ordered by depth, then index (int32), and where each
    level starts in them: a counting sort, a part at a time (argsort's int64 of 30 million
    entries would be 240 MB)."""
    cnt = np.bincount(depth[depth >= 0], minlength=nlev) if len(depth) else np.zeros(nlev, np.int64)
    bounds = np.r_[0, np.cumsum(cnt)]
    out = np.empty(int(bounds[-1]), np.int32)
    at = bounds[:-1].copy()
    for lo in range(0, len(depth), part):
        d = depth[lo:lo + part]
        idx = np.flatnonzero(d >= 0)
        o = idx[np.argsort(d[idx], kind="stable")]
        lv = d[o].astype(np.int64)
        c = np.bincount(lv, minlength=nlev)
        within = np.arange(len(o)) - (np.cumsum(c) - c)[lv]
        out[at[lv] + within] = o + lo
        at += c
    return out, bounds


class Unsupported(Exception):
    """The program is outside the fast path: use the IR's event simulation."""


def _storage_layout(p, K):
    """(offsets of in, out, scratch in a rank's storage, chunks per rank, map) for the chunk
    keys of pass 1. Aliased buffers share their storage (collectives.storage)."""
    bin_ = collectives.blocks(p.collective, "in", p.ranks) * K
    bout = collectives.blocks(p.collective, "out", p.ranks) * K
    scr = p.scratch_chunks * (K // p.chunks)
    c, inplace = p.collective, p.inplace
    if inplace and c in ("all_reduce", "broadcast", "reduce"):
        return (0, 0, bin_), bin_ + scr, (bin_, bin_, scr), None
    if inplace and c == "all_gather":    # input chunk j of rank r is output chunk r*K + j
        return (0, 0, bout), bout + scr, (K, bout, scr), "in->out"
    if inplace and c == "reduce_scatter":  # output chunk j of rank r is input chunk r*K + j
        return (0, 0, bin_), bin_ + scr, (bin_, K, scr), "out->in"
    return (0, bin_, bin_ + bout), bin_ + bout + scr, (bin_, bout, scr), None


class FastSim:
    ACCESSES = 1 << 21  # chunks a run of pass 1 looks at, at most (unless one step has more)
    KEEP_DEPTHS = 1 << 22  # units up to which run() keeps the depths for lower()
    def __init__(self, p, topo, size: int, dtype_bytes: int):
        self.p, self.topo, self.size = p, topo, size
        ops = p._ops
        if p.order != "program" or ops.after or len(ops) == 0:
            raise Unsupported
        col = ops.column
        kind = col("kind")
        if int(kind.max()) > _REDUCE or int(col("lane").max()) != 0:
            raise Unsupported  # send/recv halves or several lanes
        pieces = col("pieces")
        P = int(pieces.max())
        if int(pieces.min()) != P:
            raise Unsupported
        N, C = p.ranks, p.chunks
        self.N, self.P, self.K = N, P, C * P
        K = self.K
        for name in ("src_rank", "dst_rank"):
            c = col(name)
            if int(c.min()) < 0 or int(c.max()) >= N:
                raise Unsupported  # the lowering names the error
        # Units (op, piece) in the lowering's order: a pipelined block piece after piece.
        if P > 1:
            block = col("block").astype(np.int64)
            n = len(block)
            starts = np.flatnonzero(np.r_[True, (block[1:] != block[:-1]) | (block[1:] < 0)])
            sizes = np.diff(np.r_[starts, n])
            reps = sizes * P  # group g: for piece k, for op j of the group: unit (op, k)
            grp = np.repeat(np.arange(len(starts)), reps)
            o = np.arange(len(grp)) - np.repeat(np.cumsum(reps) - reps, reps)
            sz = sizes[grp]
            self.u_piece = (o // sz).astype(np.int16)
            self.u_op = (starts[grp] + o % sz).astype(np.int32)
            self.U = len(self.u_op)
            del grp, o, sz
        else:
            self.u_op = self.u_piece = None
            self.U = len(kind)
        # Chunk bytes (simulate._Sim.region_bytes) as prefix sums.
        E = size // dtype_bytes
        s = -(-E // K) if K else 0
        cb = np.array([max(0, min((j + 1) * s, E) - min(j * s, E)) * dtype_bytes for j in range(K)], np.int64)
        self.cum = np.r_[0, np.cumsum(cb)]
        self.block_bytes = int(self.cum[-1])
        self.scratch_bytes = s * dtype_bytes
        self.offs, self.S, self.bufsize, self.alias = _storage_layout(p, K)
        self.D = p.channel_depth
        total = size * max(collectives.blocks(p.collective, "in", N), collectives.blocks(p.collective, "out", N))
        self.intra = topo.link.params(total)
        self.net = topo.network.params(total) if topo.network else None

    # Per-unit views -----------------------------------------------------------------------------
    def units(self, lo, hi, idx=None):
        """Columns of units [lo, hi) (or of the units `idx`): kind, ranks, IR starts, counts, bufs."""
        col = self.p._ops.column
        if idx is None:
            idx = np.arange(lo, hi)
        if self.u_op is not None:
            op, piece = self.u_op[idx], self.u_piece[idx].astype(np.int64)
        else:
            op, piece = idx, None
        g = lambda name: col(name)[op].astype(np.int64)
        d = {"kind": g("kind"), "sr": g("src_rank"), "dr": g("dst_rank"), "sb": g("src_buf"), "db": g("dst_buf"),
             "ss": g("src_start"), "ds": g("dst_start"), "count": g("count")}
        if piece is not None:  # IR chunk b*C*P + i*C + c of program chunk b*C + c, piece i
            P = self.P
            for b, st in (("sb", "ss"), ("db", "ds")):
                C = np.where(d[b] == 2, self.p.scratch_chunks, self.p.chunks)
                blk, c = np.divmod(d[st], np.maximum(C, 1))
                if np.any(c + d["count"] > C):
                    raise Unsupported  # a piece of several blocks is several regions
                d[st] = blk * C * P + piece * C + c
        return d

    def region_bytes(self, buf, start, count):
        K = self.K
        end = start + count
        F = lambda x: (x // K) * self.block_bytes + self.cum[x % K]
        out = F(end) - F(start)
        return np.where(buf == 2, count * self.scratch_bytes, out)

    def keys(self, rank, buf, start, count):
        """Storage keys of every chunk of the regions (repeated per chunk), and the unit of each."""
        off = np.asarray(self.offs, np.int64)[buf]
        size = np.asarray(self.bufsize, np.int64)[buf]
        if np.any(start < 0) or np.any(start + count > size):
            raise Unsupported  # outside its buffer: the checker says so
        if self.alias == "in->out":
            start = np.where(buf == 0, rank * self.K + start, start)
        elif self.alias == "out->in":
            start = np.where(buf == 1, rank * self.K + start, start)
        base = rank * self.S + off + start
        if int(count.max(initial=1)) == 1 and int(count.min(initial=1)) == 1:
            return base, np.arange(len(base))
        which = np.repeat(np.arange(len(base)), count)
        first = np.repeat(np.cumsum(count) - count, count)
        return base[which] + (np.arange(len(which)) - first), which

    # Pass 1: depths -------------------------------------------------------------------------------
    def depths(self):
        N, U, D = self.N, self.U, self.D
        writer = np.full(N * self.S, -1, np.int16)  # depths, int32 once one does not fit
        readers = np.full(N * self.S, -1, np.int16)
        chan = np.full(N * N, -1, np.int32)  # (src, dst) -> channel id
        col = self.p._ops.column
        if self.u_op is None:
            sr, dr = col("src_rank"), col("dst_rank")
        else:
            sr, dr = col("src_rank")[self.u_op], col("dst_rank")[self.u_op]
        for lo in range(0, U, 1 << 20):
            a, b = sr[lo:lo + (1 << 20)].astype(np.int64), dr[lo:lo + (1 << 20)].astype(np.int64)
            chan[(a * N + b)[a != b]] = 0
        used = chan == 0
        nch = int(used.sum())
        chan[used] = np.arange(nch, dtype=np.int32)
        self.chan = chan
        last_send = np.full(nch, -1, np.int32)
        last_recv = np.full(nch, -1, np.int32)
        rdepth = np.full((nch, D), -1, np.int32)
        seq = np.zeros(nch, np.int64)
        dsend = np.empty(U, np.int16)  # int32 once a depth does not fit
        drecv = np.full(U, -1, np.int16)  # -1: a local step
        slot = np.empty(U, np.uint8 if D <= 255 else np.int32)
        count = col("count")
        lo, w = 0, 64
        while lo < U:
            hi = min(U, lo + w)
            c = count[lo:hi] if self.u_op is None else count[self.u_op[lo:hi]]
            if c.strides != (0,) and int(c.sum(dtype=np.int64)) > self.ACCESSES:  # chunks, not steps, make the work
                hi = lo + max(1, int(np.searchsorted(np.cumsum(c, dtype=np.int64), self.ACCESSES)))
            u = self.units(lo, hi)
            n = hi - lo
            inter = u["sr"] != u["dr"]
            cid = np.where(inter, chan[u["sr"] * N + u["dr"]], -1)
            # Accesses: (key, unit, writes) of reads of src (on the source rank) and of dst.
            rk, ru = self.keys(u["sr"], u["sb"], u["ss"], u["count"])
            wk, wu = self.keys(u["dr"], u["db"], u["ds"], u["count"])
            # Conflicts: the first unit that shares a channel, or a chunk with a write, with an
            # earlier unit of the window ends the run.
            end = n
            ci = np.flatnonzero(inter)
            if len(ci):
                c = cid[ci]
                order = np.argsort(c, kind="stable")
                cs = c[order]
                dup = np.flatnonzero(cs[1:] == cs[:-1])
                if len(dup):
                    end = min(end, int(ci[order[dup + 1]].min()))
            keys = np.concatenate([rk, wk])
            units = np.concatenate([ru, wu])
            wr = np.concatenate([np.zeros(len(rk), bool), np.ones(len(wk), bool)])
            order = np.lexsort((units, keys))
            ks, us, ws = keys[order], units[order], wr[order]
            head = np.r_[True, ks[1:] != ks[:-1]]
            gid = np.cumsum(head) - 1
            first_any = us[head][gid]
            big = np.iinfo(np.int64).max
            fw = np.where(ws, us, big)
            first_w = np.minimum.reduceat(fw, np.flatnonzero(head))[gid] if len(fw) else fw
            bad = (first_w < us) | (ws & (first_any < us))
            if bad.any():
                end = min(end, int(us[bad].min()))
            if end < n:  # take the conflict-free run and look again from its end
                hi = lo + end
                keep = lambda x: x[:end]
                u = {k: keep(v) for k, v in u.items()}
                inter, cid = inter[:end], cid[:end]
                rm, wm = ru < end, wu < end
                rk, ru, wk, wu = rk[rm], ru[rm], wk[wm], wu[wm]
                n = end
            # Depth of the send (or local step): its source's writers, and for a local step its
            # destination's writers and readers; the channel's last send and receive k - D.
            dep = np.full(n, -1, np.int32)
            np.maximum.at(dep, ru, writer[rk])
            ci = np.flatnonzero(inter)
            c = cid[ci]
            k = seq[c]
            sl = k % D
            np.maximum.at(dep, ci, np.maximum(last_send[c], rdepth[c, sl]))
            loc = ~inter
            lw = loc[wu]
            np.maximum.at(dep, wu[lw], np.maximum(writer[wk[lw]], readers[wk[lw]]))
            ds = dep + 1
            # Receives: the channel's last receive, the send, the destination's writers and readers.
            rdep = np.full(n, -1, np.int32)
            iw = ~lw
            np.maximum.at(rdep, wu[iw], np.maximum(writer[wk[iw]], readers[wk[iw]]))
            rdep[ci] = np.maximum(np.maximum(rdep[ci], last_recv[c]), ds[ci])
            dr = np.where(inter, rdep + 1, -1).astype(np.int32)
            if dsend.dtype == np.int16 and max(int(dr.max(initial=0)), int(ds.max(initial=0))) >= _I16:
                dsend, drecv = dsend.astype(np.int32), drecv.astype(np.int32)
                writer, readers = writer.astype(np.int32), readers.astype(np.int32)
            # State after the run: readers of the sources, writers of the destinations.
            np.maximum.at(readers, rk, ds[ru])
            wd = np.where(inter, dr, ds)
            writer[wk] = wd[wu]
            readers[wk] = -1
            last_send[c] = ds[ci]
            last_recv[c] = dr[ci]
            rdepth[c, sl] = dr[ci]
            seq[c] = k + 1
            dsend[lo:hi] = ds
            drecv[lo:hi] = dr
            slot[lo + ci] = sl
            w = max(64, min(1 << 16, 2 * n))
            lo = hi
        self.slot = slot
        return dsend, drecv

    # The IR, for the event simulation ---------------------------------------------------------
    def lower(self, ds, dr):
        """The IR that Program.lower() gives, from the depths (one lane: no deps)."""
        from .ir import IR, Step
        from .language import KINDS

        N, U = self.N, self.U
        u = self.units(0, U)
        inter = u["sr"] != u["dr"]
        cid = np.where(inter, self.chan[np.where(inter, u["sr"] * N + u["dr"], 0)], -1)
        ii = np.flatnonzero(inter)
        o = ii[np.argsort(cid[ii], kind="stable")]
        cs = cid[o]
        head = np.r_[True, cs[1:] != cs[:-1]] if len(cs) else np.zeros(0, bool)
        starts = np.flatnonzero(head)
        seq = np.zeros(U, np.int64)
        seq[o] = np.arange(len(o)) - np.repeat(starts, np.diff(np.r_[starts, len(o)]))
        su = np.arange(U)
        unit = np.r_[su, ii]
        isr = np.r_[np.zeros(U, np.int64), np.ones(len(ii), np.int64)]
        rank = np.r_[u["sr"], u["dr"][ii]]
        depth = np.r_[ds.astype(np.int64), dr[ii].astype(np.int64)]
        order = np.lexsort((2 * unit + isr, depth, rank))
        bufs = [collectives.BUFFERS[b] for b in range(3)]
        cols = {k: v.tolist() for k, v in u.items()}
        inter_l, seq_l = inter.tolist(), seq.tolist()
        steps = [[[]] for _ in range(N)]
        for x, r in zip(unit[order].tolist(), (isr[order] == 1).tolist()):
            kind = KINDS[cols["kind"][x]]
            sreg = (bufs[cols["sb"][x]], cols["ss"][x], cols["count"][x])
            dreg = (bufs[cols["db"][x]], cols["ds"][x], cols["count"][x])
            if r:
                st = Step("recv" if kind == "copy" else "recv_reduce", None, dreg, cols["sr"][x], seq_l[x])
                steps[cols["dr"][x]][0].append(st)
            elif inter_l[x]:
                steps[cols["sr"][x]][0].append(Step("send", sreg, None, cols["dr"][x], seq_l[x]))
            else:
                steps[cols["sr"][x]][0].append(Step(kind, sreg, dreg))
        p = self.p
        return IR(name=p.name, collective=p.collective, ranks=N, chunks=self.K, steps=steps, pieces=self.P,
                  root=p.root, inplace=p.inplace, scratch=p.scratch_chunks * self.P,
                  channel_depth=p.channel_depth)

    # Pass 2: times ---------------------------------------------------------------------------------
    def run(self):
        """(end, steps, messages, sent, port bytes, port busy, first use, first node), or the IR
        when a port serves several senders at once."""
        ds, dr = self.depths()
        nlev = int(max(ds.max(initial=0), dr.max(initial=0))) + 2
        os_, bs = _by_level(ds, nlev)
        or_, br = _by_level(dr, nlev)
        if self.U > self.KEEP_DEPTHS:
            ds = dr = None  # made again if the IR is needed
        out = self.levels(os_, bs, or_, br, nlev)
        if out is not None:
            return out
        del os_, or_
        return self.lower(*(self.depths() if ds is None else (ds, dr)))

    def levels(self, os_, bs, or_, br, nlev):
        topo = self.topo
        N = self.N

        per_host, nics = topo.per_host, topo.nics
        H = topo.hosts
        intra = self.intra
        net = self.net
        nch = int(self.chan.max()) + 1 if self.chan.size else 0
        D = self.D
        arrive = np.zeros((nch, D))
        rfin = np.zeros((nch, D))
        amd = np.zeros((nch, D), np.int64)   # message depth of the send of slot
        rmd = np.zeros((nch, D), np.int64)   # message depth of the receive of slot
        lane_fin = np.zeros(N)
        lane_md = np.zeros(N, np.int64)
        lane_pos = np.zeros(N, np.int64)
        nports = 2 * N + 2 * H * nics
        pf = np.zeros(nports)
        ls = np.full(nports, -1.0)
        pbytes = np.zeros(nports, np.int64)
        pbusy = np.zeros(nports)
        pfirst = np.full(nports, np.inf)
        pfirst_node = np.zeros(nports, np.int64)
        sent = np.zeros(N, np.int64)
        end = 0.0
        steps = 0
        messages = 0
        gamma, copy_gamma = topo.gamma, topo.copy_gamma
        for d in range(nlev):
            su = os_[bs[d]:bs[d + 1]]
            ru = or_[br[d]:br[d + 1]]
            if not len(su) and not len(ru):
                continue
            us = self.units(0, 0, su)
            ur = self.units(0, 0, ru)
            # One list of this level's steps: (unit, is a receive), on lane (rank).
            unit = np.r_[su.astype(np.int64), ru.astype(np.int64)]
            isr = np.r_[np.zeros(len(su), bool), np.ones(len(ru), bool)]
            rank = np.r_[us["sr"], ur["dr"]]
            kindc = np.r_[us["kind"], ur["kind"]]
            peer = np.r_[us["dr"], ur["sr"]]
            src_rank = np.r_[us["sr"], ur["sr"]]
            dst_rank = np.r_[us["dr"], ur["dr"]]
            local = (src_rank == dst_rank) & ~isr
            sbytes = np.r_[self.region_bytes(us["sb"], us["ss"], us["count"]),
                           np.zeros(len(ru), np.int64)]
            dbytes = np.r_[self.region_bytes(us["db"], us["ds"], us["count"]),
                           self.region_bytes(ur["db"], ur["ds"], ur["count"])]
            apart = src_rank != dst_rank
            cid = np.where(apart, self.chan[np.where(apart, src_rank * N + dst_rank, 0)], 0)
            sl = self.slot[unit].astype(np.int64)
            # Steps of one lane in one level run in program order: rounds of one per lane.
            g = 2 * unit + isr
            order = np.lexsort((g, rank))
            rs = rank[order]
            head = np.r_[True, rs[1:] != rs[:-1]]
            starts = np.flatnonzero(head)
            occ_i = np.arange(len(rs)) - np.repeat(starts, np.diff(np.r_[starts, len(rs)]))
            rounds = int(occ_i.max()) + 1 if len(occ_i) else 0
            for j in range(rounds):
                sel = order[occ_i == j]
                r = rank[sel]
                ready = lane_fin[r].copy()
                md = lane_md[r].copy()
                pos = lane_pos[r]
                lane_pos[r] = pos + 1
                node = r * (1 << 40) + pos  # simulate's node order: rank, then place in lane
                is_recv = isr[sel]
                is_loc = local[sel]
                is_send = ~is_recv & ~is_loc
                c, k = cid[sel], sl[sel]
                f = np.empty(len(sel))
                # Sends: after receive k - D of the channel; hold both ports.
                si = np.flatnonzero(is_send)
                if len(si):
                    cs, ks = c[si], k[si]
                    t0 = np.maximum(ready[si], rfin[cs, ks])
                    m0 = np.maximum(md[si], rmd[cs, ks])
                    a, b = src_rank[sel[si]], dst_rank[sel[si]]
                    nb = sbytes[sel[si]]
                    same = a // per_host == b // per_host
                    if H > 1:
                        alpha = np.where(same, intra[0], net[0])
                        beta = np.where(same, intra[1], net[1])
                    else:
                        alpha = np.full(len(si), intra[0])
                        beta = np.full(len(si), intra[1])
                    po = np.where(same, a, 2 * N + (a // per_host) * nics + a % per_host % nics)
                    pi = np.where(same, N + b, 2 * N + H * nics + (b // per_host) * nics + b % per_host % nics)
                    occ = nb * beta
                    start = np.maximum(t0, np.maximum(pf[po], pf[pi]))
                    busy = (start > t0) | ((ls[po] == t0) & (occ > 0)) | ((ls[pi] == t0) & (occ > 0))
                    if busy.any() or len(np.unique(np.r_[po, pi])) < 2 * len(si):
                        return None  # a port serves several senders at once: order matters
                    pf[po] = pf[pi] = start + occ
                    ls[po] = ls[pi] = start
                    np.add.at(pbytes, po, nb)
                    np.add.at(pbytes, pi, nb)
                    np.add.at(pbusy, po, occ)
                    np.add.at(pbusy, pi, occ)
                    nd = node[si]
                    for pp in (po, pi):
                        new = pfirst[pp] == np.inf
                        pfirst[pp[new]] = t0[new]
                        pfirst_node[pp[new]] = 2 * nd[new] + (pp is pi)
                    f[si] = start + occ
                    arrive[cs, ks] = start + alpha + occ
                    amd[cs, ks] = m0
                    np.add.at(sent, a, nb)
                    messages += len(si)
                    md[si] = m0
                ri = np.flatnonzero(is_recv)
                if len(ri):
                    cr, kr = c[ri], k[ri]
                    t0 = np.maximum(ready[ri], arrive[cr, kr])
                    m0 = np.maximum(md[ri], amd[cr, kr] + 1)
                    red = kindc[sel[ri]] == _REDUCE
                    f[ri] = t0 + dbytes[sel[ri]] * np.where(red, gamma, copy_gamma)
                    rfin[cr, kr] = f[ri]
                    rmd[cr, kr] = m0
                    md[ri] = m0
                li = np.flatnonzero(is_loc)
                if len(li):
                    red = kindc[sel[li]] == _REDUCE
                    f[li] = ready[li] + dbytes[sel[li]] * np.where(red, gamma, copy_gamma)
                lane_fin[r] = f
                lane_md[r] = md
                if len(f):
                    end = max(end, float(f.max()))
                    steps = max(steps, int(md.max()))
        self.sent = sent
        return end, steps, messages, sent, pbytes, pbusy, pfirst, pfirst_node

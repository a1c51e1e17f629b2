"""Receiving from any source (`dist.recv` / `dist.irecv` without src) on CPU tensors: the sender's
rank comes back and the data is the sender's; tags still match, specific and any-source receives
mix, a wrong size and a silent group raise within the timeout, CUDA tensors are refused clearly.
"""
import datetime
import time

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import Cases
from ranks import IS_GLOO, quiet, run_ranks
from reference import gen

N = 1031


def _payload(src, round_, n=N):
    return gen(torch.float32, "data", (n,), 1000 * src + round_)


def _any_source_rank(rank, ws, seed):
    quiet()
    cases = Cases("recv any source", rank, ws, seed)
    for round_ in range(3):
        with cases.case(round=round_, receiver=round_ % ws):
            receiver = round_ % ws
            if rank == receiver:
                seen = []
                for i in range(ws - 1):
                    out = torch.full((N,), -1.0)
                    if i % 2 == 0:
                        src = dist.recv(out)  # blocking form: returns the sender
                    else:
                        work = dist.irecv(out)
                        work.wait()
                        src = work._source_rank()
                    seen.append(src)
                    cases.check(f"data from rank {src}", out, _payload(src, round_))
                cases.expect(sorted(seen) == [r for r in range(ws) if r != rank], f"senders {seen}")
            else:
                dist.send(_payload(rank, round_), receiver)
            dist.barrier()
    # Tags: rank 1 sends tag 7 then tag 3; rank 0 first receives tag 3 from any source, then tag 7.
    with cases.case(what="tags"):
        if rank == 1:
            dist.send(_payload(1, 70), 0, tag=7)
            dist.send(_payload(1, 30), 0, tag=3)
        if rank == 0:
            a, b = torch.empty(N), torch.empty(N)
            cases.expect(dist.recv(a, tag=3) == 1, "tag 3 from rank 1")
            cases.expect(dist.recv(b, tag=7) == 1, "tag 7 from rank 1")
            cases.check("tag 3 data", a, _payload(1, 30))
            cases.check("tag 7 data", b, _payload(1, 70))
        dist.barrier()
    # A receive from any source beside one from a given source, into a non-contiguous tensor.
    with cases.case(what="specific then any, strided"):
        if rank == 0:
            base = torch.zeros(2 * N)
            view = base[::2]
            specific = torch.empty(N)
            w1 = dist.irecv(specific, src=ws - 1)
            w2 = dist.irecv(view)
            w1.wait()
            w2.wait()
            cases.check("specific", specific, _payload(ws - 1, 5))
            src = w2._source_rank()
            cases.check("any, strided", view, _payload(src, 5))
            cases.check("between the strided elements", base[1::2], torch.zeros(N))
        else:
            # Two messages reach rank 0: from rank 1 and rank ws-1 (twice from rank 1 with 2 ranks).
            for _ in range(2 if ws == 2 else int(rank in (1, ws - 1))):
                dist.send(_payload(rank, 5), 0)
        dist.barrier()
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_recv_from_any_source(ws, seed):
    run_ranks(ws, _any_source_rank, seed, timeout=120)


def _wrong_size_rank(rank, ws):
    quiet()
    if rank == 1:
        dist.send(torch.ones(10), 0)
    else:
        with pytest.raises(RuntimeError, match="sent 40 bytes.*expects 44 bytes"):
            dist.recv(torch.empty(11))
    dist.barrier()


@pytest.mark.pycoll_only
def test_recv_from_any_source_checks_the_size():
    run_ranks(2, _wrong_size_rank)


def _silent_rank(rank, ws):
    quiet()
    if rank == 0:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="any source|timed out"):
            dist.recv(torch.empty(4))
        took = time.monotonic() - t0
        assert took < 20, f"raised only after {took:.1f}s"
    else:
        time.sleep(8)


@pytest.mark.pycoll_only
def test_recv_from_any_source_times_out_when_nobody_sends():
    run_ranks(2, _silent_rank, pg_timeout=datetime.timedelta(seconds=3), destroy=False,
              expect_exit=None, timeout=60)


def _cuda_rank(rank, ws):
    quiet()
    with pytest.raises(RuntimeError, match="supports CPU tensors"):
        dist.recv(torch.empty(4, device="cuda"))


@pytest.mark.gpu
@pytest.mark.shares_gpus  # both ranks on their current device, cuda:0
@pytest.mark.pycoll_only
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_recv_from_any_source_refuses_cuda_tensors():
    run_ranks(2, _cuda_rank)

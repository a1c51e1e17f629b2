"""CUDA stream semantics of the engine's collectives (ordering on the current stream, async Work,
tensor lifetime, two issuing streams) and CUDA graph capture and replay.
"""
import torch
import torch.distributed as dist

from gpu_collectives_util import (GPU_MARKS, PG_TIMEOUT, WORLD, check_graph_replays, check_sync_op_on_side_stream,
                                  run_as_script, setup_device)
from ranks import run_ranks, set_algo

pytestmark = GPU_MARKS


# ---------------------------------------------------------------------------------------------
# stream semantics, tensor lifetime, CUDA graphs


def _streams(rank, world, seed):
    dev = setup_device(rank)
    for algo in ("oneshot", "twoshot", "ring", "tree"):
        set_algo(algo)
        # The input is produced late on the current stream: the collective must wait for it.
        x = torch.empty(1 << 20, device=dev)
        torch.cuda._sleep(20_000_000)  # about 10 ms of GPU time before the fill
        x.fill_(float(rank + 1))
        work = dist.all_reduce(x, async_op=True)
        work.wait()  # makes the current stream wait, no host sync
        y = x * 2  # runs on the current stream after the collective
        assert torch.all(y == world * (world + 1)), f"{algo}: stream ordering broken"

        # A tensor freed right after an async collective must not be handed out again before the
        # collective is done with it (recordStream on the communication stream).
        torch.cuda._sleep(20_000_000)
        z = torch.ones(1 << 22, device=dev)
        work = dist.all_reduce(z, async_op=True)
        del z
        w = torch.full((1 << 22,), 7.0, device=dev)  # would reuse z's block if it were free
        work.wait()
        torch.cuda.synchronize()
        assert torch.all(w == 7.0), f"{algo}: freed tensor reused while the collective used it"

        # A synchronous collective runs on the caller's current stream (here a side stream).
        check_sync_op_on_side_stream(rank, world, dev, algo)

        # The Work of a synchronous op still completes its Future (made on demand) and reports
        # completion.
        opts = dist.AllreduceOptions()
        opts.asyncOp = False
        q = torch.full((1031,), float(rank + 1), device=dev)
        work = dist.group.WORLD.allreduce([q], opts)
        got = work.get_future().wait()[0]
        assert torch.all(got == world * (world + 1) / 2), f"{algo}: sync op's Future holds a wrong value"
        torch.cuda.synchronize()
        assert work.is_completed(), f"{algo}: sync op not completed after synchronize"

        # Collectives issued from two streams (FSDP2 all-gathers on one, reduce-scatters on
        # another) still run in issue order on every rank: rank 0 delays stream a, so without
        # ordering its all_gather on stream b would run before its all_reduce, unlike rank 1's.
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        xa = torch.full((4099,), float(rank + 1), device=dev)
        xb = torch.full((1000,), float(rank + 1), device=dev)
        gb = torch.empty(world * 1000, device=dev)
        a.wait_stream(torch.cuda.current_stream())
        b.wait_stream(torch.cuda.current_stream())
        for _ in range(3):
            with torch.cuda.stream(a):
                if rank == 0:
                    torch.cuda._sleep(20_000_000)
                dist.all_reduce(xa)
            with torch.cuda.stream(b):
                dist.all_gather_into_tensor(gb, xb, async_op=(rank % 2 == 1))
        torch.cuda.synchronize()
        s_ranks = world * (world + 1) / 2
        assert torch.all(xa == world * world * s_ranks), f"{algo}: two-stream all_reduce gave {xa[0].item()}"
        want_gb = torch.arange(1, world + 1, device=dev, dtype=torch.float32).repeat_interleave(1000)
        assert torch.equal(gb, want_gb), f"{algo}: two-stream all_gather wrong"
    set_algo("auto")


def test_stream_semantics(seed):
    run_ranks(WORLD, _streams, seed, timeout=300, pg_timeout=PG_TIMEOUT)


def _graphs(rank, world, seed):
    dev = setup_device(rank)
    for algo in ("oneshot", "twoshot"):
        set_algo(algo)
        check_graph_replays(rank, world, [torch.zeros(4099, device=dev)])  # warm-up outside the graph
    set_algo("auto")


def test_cuda_graph_replay(seed):
    run_ranks(WORLD, _graphs, seed, timeout=300, pg_timeout=PG_TIMEOUT)


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())

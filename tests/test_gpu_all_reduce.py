"""all_reduce on the CUDA engine: every dtype, reduce op, algorithm and size; 64-256 MiB messages;
tensors at odd offsets inside their allocation, and non-contiguous ones.
"""
import torch
import torch.distributed as dist

from gpu_collectives_util import (ALGOS, DTYPES, GPU_MARKS, PG_TIMEOUT, SIZES, WORLD, R, assert_same_digests,
                                  check_close, digest, large_sum, make_input, op_name, ops_for, reference,
                                  run_as_script, setup_device)
from ranks import run_ranks, set_algo

pytestmark = GPU_MARKS


# ---------------------------------------------------------------------------------------------
# all_reduce


def _all_reduce_matrix(rank, world, seed):
    dev = setup_device(rank)
    out = []
    for algo in ALGOS:
        set_algo(algo)
        for dtype in DTYPES:
            for op in ops_for(dtype):
                for numel in SIZES:
                    key = ("ar", algo, str(dtype), op_name(op), numel)
                    xs = [make_input(seed, key, q, numel, dtype, dev, op) for q in range(world)]
                    t = xs[rank].clone()
                    dist.all_reduce(t, op=op)
                    check_close(t, reference(xs, op, dtype), dtype, str(key))
                    out.append((str(key), digest(t)))
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_all_reduce_every_dtype_op_algo_size(seed):
    assert_same_digests(run_ranks(WORLD, _all_reduce_matrix, seed, timeout=600, pg_timeout=PG_TIMEOUT))


def _all_reduce_large(rank, world, seed):
    dev = setup_device(rank)
    out = []
    cases = [(64 << 20, torch.float32), (64 << 20, torch.bfloat16), (256 << 20, torch.float32)]
    for nbytes, dtype in cases:
        numel = nbytes // torch.tensor([], dtype=dtype).element_size()
        for algo in ALGOS:
            set_algo(algo)
            out.append(large_sum(seed, ("ar-large", algo, str(dtype), numel), rank, world, numel, dtype, dev))
    set_algo("auto")
    return out


def test_all_reduce_large(seed):
    assert_same_digests(run_ranks(WORLD, _all_reduce_large, seed, timeout=600, pg_timeout=PG_TIMEOUT))


def _all_reduce_layouts(rank, world, seed):
    """Tensors at odd element offsets inside an allocation, and non-contiguous ones."""
    dev = setup_device(rank)
    out = []
    for algo in ALGOS:
        set_algo(algo)
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.bool):
            for numel in (1, 7, 1031, 300007):
                for offset in (1, 3):
                    key = ("ar-offset", algo, str(dtype), numel, offset)
                    xs = [make_input(seed, key, q, numel, dtype, dev) for q in range(world)]
                    base = make_input(seed, key + ("base",), rank, numel + offset + 5, dtype, dev)
                    guard = base.clone()
                    t = base[offset:offset + numel]
                    t.copy_(xs[rank])
                    dist.all_reduce(t, op=R.MAX)
                    check_close(t, reference(xs, R.MAX, dtype), dtype, str(key))
                    # Nothing outside the view was touched.
                    assert torch.equal(base[:offset], guard[:offset]), key
                    assert torch.equal(base[offset + numel:], guard[offset + numel:]), key
                    out.append((str(key), digest(t)))
            # Non-contiguous: every other element of a 2-column view.
            key = ("ar-strided", algo, str(dtype))
            xs = [make_input(seed, key, q, 2 * 4099, dtype, dev) for q in range(world)]
            t = xs[rank].clone().view(4099, 2)[:, 0]
            try:
                dist.all_reduce(t, op=R.MAX)
            except (RuntimeError, ValueError):
                pass  # rejecting non-contiguous input is acceptable; corrupting it is not
            else:
                want = reference([x.view(4099, 2)[:, 0] for x in xs], R.MAX, dtype)
                check_close(t, want, dtype, str(key))
                out.append((str(key), digest(t)))
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_all_reduce_odd_offsets_and_strides(seed):
    assert_same_digests(run_ranks(WORLD, _all_reduce_layouts, seed, timeout=600, pg_timeout=PG_TIMEOUT))


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())

"""The memory floor pycoll-bench prints beside CPU rows (pycollectives/bench/floor.py): each op's
floor call does the one-pass work the issue defines, on the bytes the op must touch."""

import pytest
import torch

from pycollectives.bench import floor


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_reduce_scatter_floor_adds_every_rank_block(world):
    """The reduce_scatter floor adds the ranks' blocks into one output block (out = b0 + b1 + ...),
    in place of torch.sum over dim 0, which took 1.5-3.6x the time of the add for 2 ranks."""
    g = torch.Generator().manual_seed(world)
    blocks = torch.randn(world, 1031, generator=g, dtype=torch.float64)
    out = torch.empty(1031, dtype=torch.float64)
    ref = blocks[0].clone()
    for k in range(1, world):
        ref += blocks[k]
    assert floor.add_blocks(blocks, out) is out
    assert torch.equal(out, ref)
    # The callable the benchmark times: its blocks are ones, so every output element is `world`.
    result = floor.floor_call("reduce_scatter", world * 4096, torch.float32, world)()
    assert result.shape == (4096,) and torch.all(result == world)


@pytest.mark.parametrize("op", ["all_gather", "broadcast", "sendrecv"])
def test_copy_floors_write_the_whole_message(op):
    src_value = floor.floor_call(op, 4099, torch.float32, 2)()
    assert src_value.shape == (4099,) and torch.all(src_value == 1)


def test_all_reduce_floor_is_one_add():
    x = floor.floor_call("all_reduce", 777, torch.float32, 3)()
    assert x.shape == (777,) and torch.all(x == 2)  # ones + ones, once per call

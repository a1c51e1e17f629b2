"""The CUDA IPC workspace layout (csrc/transport/cuda_ipc/layout.h), checked without a GPU: every
byte range the layout's offset functions address in one rank's workspace (channel flags, check
words, counters, slots, LL epochs and LL lines, for every peer, CTA, slot and parity) must lie
inside the region make_layout reserved for it and inside the allocation, and no two may overlap.
An off-by-one in an offset function would otherwise show up on the GPU only as a rare corruption."""
import pytest

import pycollectives

layout = pycollectives._C.cuda_workspace_layout
KiB, MiB = 1 << 10, 1 << 20


def _check(doc):
    total = doc["total_bytes"]
    starts = sorted(doc["starts"], key=lambda s: s[1])
    offsets = [off for _, off in starts]
    assert len(set(offsets)) == len(offsets), f"two regions start at the same offset: {starts}"
    end_of = {name: (starts[i + 1][1] if i + 1 < len(starts) else total) for i, (name, _) in enumerate(starts)}
    start_of = dict(starts)
    everything = []
    for name, ranges in doc["ranges"].items():
        assert ranges, name
        for b, e in ranges:
            assert start_of[name] <= b < e <= end_of[name], f"{name}: [{b}, {e}) outside its region"
        everything.extend((b, e, name) for b, e in ranges)
    everything.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(everything, everything[1:]):
        assert e0 <= b1, f"{n0} [{b0}, {e0}) overlaps {n1} [{b1}, {e1})"
    assert everything[-1][1] <= total and total % (2 * MiB) == 0
    return doc


@pytest.mark.parametrize("nranks", range(2, 9))
def test_every_range_is_inside_its_region_and_disjoint(nranks):
    for rank in {0, nranks - 1}:
        _check(layout(nranks, rank))


@pytest.mark.parametrize("nranks,blocks", [(2, 128), (4, 96), (8, 128)])
def test_more_ctas_grow_the_channels(nranks, blocks):
    doc = _check(layout(nranks, nranks - 1, coll_blocks=blocks))
    assert doc["coll_blocks"] == blocks
    slots = doc["ranges"]["coll.data"]
    assert len(slots) == (nranks - 1) * blocks * 4


@pytest.mark.parametrize("nranks,slot", [(2, 256 * KiB), (3, 256 * KiB), (4, 256 * KiB), (5, 128 * KiB),
                                         (7, 128 * KiB), (8, 64 * KiB)])
def test_default_slot_size_by_world(nranks, slot):
    # 256 KiB slots up to 4 ranks (measured on 4x H200, layout.h), smaller beyond.
    assert layout(nranks)["coll_slot_bytes"] == slot


def test_explicit_slot_size():
    doc = _check(layout(3, 1, coll_slot_bytes=96 * KiB))
    assert doc["coll_slot_bytes"] == 96 * KiB
    assert all(e - b == 96 * KiB for b, e in doc["ranges"]["coll.data"])


@pytest.mark.parametrize("nranks", [2, 5, 8])
def test_ll_region(nranks):
    doc = layout(nranks, 0)
    # 64 CTAs x 16 KiB of payload = the 1 MiB LL limit; one region per (parity, sender, CTA), each a
    # header line plus 8 payload bytes per 16-byte line.
    assert doc["ll_blocks"] * doc["ll_block_payload_bytes"] == doc["ll_max_bytes"] == MiB
    regions = doc["ranges"]["ll.data"]
    assert len(regions) == 2 * (nranks - 1) * doc["ll_blocks"]
    assert all(e - b == 16 + 2 * doc["ll_block_payload_bytes"] for b, e in regions)
    assert all(b % 16 == 0 for b, _ in regions)


@pytest.mark.parametrize("nranks", [2, 8])
def test_flags_of_different_writers_do_not_share_a_line(nranks):
    doc = layout(nranks, 0)
    for name in ("coll.tail", "coll.head", "p2p.tail", "p2p.head"):
        starts = sorted(b for b, _ in doc["ranges"][name])
        assert all(b1 - b0 >= 128 for b0, b1 in zip(starts, starts[1:])), name
    assert all(b % 16 == 0 for b, _ in doc["ranges"]["coll.data"])


def test_bad_arguments():
    with pytest.raises(ValueError):
        layout(1)
    with pytest.raises(ValueError):
        layout(9)
    with pytest.raises(ValueError):
        layout(4, 4)
    with pytest.raises(ValueError):
        layout(2, 0, coll_blocks=32)


@pytest.mark.parametrize("nranks,max_bytes", [(2, 64 * MiB), (2, 1), (3, 5 * MiB + 7), (8, 16 * MiB)])
def test_ll128_region(nranks, max_bytes):
    for rank in {0, nranks - 1}:
        doc = _check(layout(nranks, rank, ll128_max_bytes=max_bytes))
        lines = doc["ll128_max_lines"]
        # Every segment of a message up to max_bytes fits, for every element size: the engine's
        # segment is ceil(count / n) elements rounded up to 16 bytes.
        assert lines == pycollectives._C.ll128_lines_for(max_bytes, nranks)
        for es in (1, 2, 4, 8):
            for nbytes in {max_bytes - max_bytes % es, es, min(max_bytes, 8 * es) - min(max_bytes, 8 * es) % es}:
                if nbytes <= 0:
                    continue
                seg = -(-(nbytes // es) // nranks) * es
                seg = -(-seg // 16) * 16
                assert lines * 120 >= min(seg, nbytes), (es, nbytes)
        data = doc["ranges"]["ll128.data"]
        assert len(data) == 2 * (nranks - 1) and all(e - b == 128 * lines for b, e in data)
        assert all(b % 128 == 0 for b, _ in data + doc["ranges"]["ll128.header"])
        assert len(doc["ranges"]["ll128.header"]) == (nranks - 1) * 2 * 128


def test_no_ll128_region_by_default():
    doc = layout(2, 0)
    assert doc["ll128_max_lines"] == 0 and "ll128.data" not in doc["ranges"]
    assert layout(2, 0, ll128_max_bytes=64 * MiB)["total_bytes"] > doc["total_bytes"] + 64 * MiB

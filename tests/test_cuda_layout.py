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
        # A registered protocol's ranges ("ll128.data") lie in its one region ("ll128").
        region = name if name in start_of else name.split(".")[0]
        for b, e in ranges:
            assert start_of[region] <= b < e <= end_of[region], f"{name}: [{b}, {e}) outside its region"
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


@pytest.mark.parametrize("nranks", [2, 3, 8])
def test_registered_protocol_regions(nranks):
    # Each registered protocol's region, at a small and a large limit, and all of them at once.
    names = [p["name"] for p in pycollectives._C.cuda_all_reduce_protocols() if p["has_region"]]
    assert names  # LL128's at least
    plain = layout(nranks, 0)
    assert plain["regions"] == {}
    for limits in [{n: 1} for n in names] + [{n: 64 * MiB} for n in names] + [{n: 8 * MiB for n in names}]:
        for rank in {0, nranks - 1}:
            doc = _check(layout(nranks, rank, protocols=limits))
            assert set(doc["regions"]) == set(limits)
            for name, r in doc["regions"].items():
                assert r["bytes"] > 0 and r["off"] % 4096 == 0 and r["off"] >= plain["total_bytes"] - 2 * MiB
                assert any(k == name or k.startswith(name + ".") for k in doc["ranges"])
    with pytest.raises(ValueError, match="no all_reduce protocol named 'nope'"):
        layout(2, 0, protocols={"nope": MiB})

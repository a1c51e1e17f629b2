"""The CUDA engine's cut of a send/recv (gpu::plan_p2p) and the all_to_all's CTA roles
(cuda/kernels/all_to_all_role.h), tested without a GPU through pycollectives._C: both ends of a pair
must derive the same launch from what they both know, every byte must have a chunk, and every
side of every pair exactly one CTA. A coalesced batch (gpu::plan_p2p_batch) keeps every message's
cut and runs in one launch only where no CTA can wait on one that is not placed. docs/decisions/0011-p2p-channels.md."""
import pytest

import pycollectives

p2p_plan = pycollectives._C.cuda_p2p_plan
roles = pycollectives._C.cuda_all_to_all_roles
batch_plan = pycollectives._C.cuda_p2p_batch_plan

KiB, MiB = 1 << 10, 1 << 20
SIZES = (1, 7, 4095, 4096, 4097, 128 * KiB - 1, 128 * KiB, 128 * KiB + 1, MiB, 4 * MiB + 3, 8 * MiB,
         33 * MiB + 5, 256 * MiB, 1 << 30, (1 << 34) + 1)


@pytest.mark.parametrize("world", range(2, 9))
@pytest.mark.parametrize("sms", (132, 108, 40, 1))
def test_every_byte_has_a_chunk_and_every_chunk_a_slot(world, sms):
    for nbytes in SIZES:
        p = p2p_plan(nbytes, world, sms)
        what = (world, sms, nbytes, p)
        assert 1 <= p["blocks"] <= min(64, p["channels"], max(1, (sms - 4) // 2), p["nchunks"]), what
        assert 0 < p["chunk"] <= p["slot_bytes"], what
        assert (p["nchunks"] - 1) * p["chunk"] < nbytes <= p["nchunks"] * p["chunk"], what
        assert p["chunk"] % 4096 == 0 or p["nchunks"] == 1, what
        # Chunks are not cut finer than 128 KiB (or the slot) unless the message is smaller.
        assert p["chunk"] >= min(128 * KiB, p["slot_bytes"]) or p["nchunks"] == 1, what


@pytest.mark.parametrize("sms", (78, 108, 114, 132, 144))
def test_kernels_that_wait_on_each_other_leave_sms_free(sms):
    # Every CTA fills an SM; a send and a receive at once, or an all_to_all, must leave room for a
    # CTA of the kernel the peer waits on, or the ranks can wait on each other for good.
    assert 2 * p2p_plan(1 << 30, 2, sms)["blocks"] <= sms - 4
    assert len(roles(2, 0, 128, sms)) <= sms - 4
    assert len(roles(8, 0, 64, sms)) <= sms - 4


def test_sizes_scale_the_ctas_on_h100_class_gpus():
    by_size = {n: p2p_plan(n, 2)["blocks"] for n in (64 * KiB, 128 * KiB, 4 * MiB, 8 * MiB, 1 << 30)}
    assert by_size == {64 * KiB: 1, 128 * KiB: 1, 4 * MiB: 32, 8 * MiB: 64, 1 << 30: 64}
    # Two ranks: 512 KiB slots; a chunk grows past 128 KiB only where every CTA still carries 4
    # chunks, from 32 MiB (decision 0017). 3-4 ranks keep 128 KiB, 5-8 ranks 64 KiB.
    assert p2p_plan(1 << 30, 2)["slot_bytes"] == 512 * KiB
    sizes = (MiB, 8 * MiB, 16 * MiB, 32 * MiB, 32 * MiB + 1, 64 * MiB, 128 * MiB, 1 << 30)
    assert [p2p_plan(n, 2)["chunk"] // KiB for n in sizes] == [128, 128, 128, 128, 132, 256, 512, 512]
    assert p2p_plan(1 << 30, 3)["slot_bytes"] == p2p_plan(1 << 30, 4)["slot_bytes"] == 128 * KiB
    assert p2p_plan(1 << 30, 8)["slot_bytes"] == 64 * KiB
    # A receive of 16 CTAs or more (more than 15 chunks of 128 KiB) waits for its first chunk on
    # one CTA first.
    assert [p2p_plan(n, 2)["gated"] for n in (0, 1, MiB, 15 * 128 * KiB, 15 * 128 * KiB + 1, 4 * MiB, 1 << 30)] == \
        [False, False, False, False, True, True, True]
    # No bytes: one empty chunk on one CTA (it carries the length to the receiver).
    assert (p2p_plan(0, 2)["nchunks"], p2p_plan(0, 2)["blocks"]) == (1, 1)


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("coll_channels,sms", ((64, 132), (128, 132), (64, 40), (16, 132), (64, 1), (8, 6)))
def test_all_to_all_serves_every_side_of_every_pair_once(world, coll_channels, sms):
    grids = {len(roles(world, r, coll_channels, sms)) for r in range(world)}
    assert len(grids) == 1, "every rank launches the same grid"
    per_pair = {r: [x for x in roles(world, r, coll_channels, sms)] for r in range(world)}
    channels = {c for r in range(world) for (peer, _, c, _) in per_pair[r] if peer >= 0}
    assert len(channels) <= 1, "every pair has the same number of channels"
    for r in range(world):
        sends = [(peer, chan) for peer, chan, _, sender in per_pair[r] if peer >= 0 and sender]
        recvs = [(peer, chan) for peer, chan, _, sender in per_pair[r] if peer >= 0 and not sender]
        if world == 1:
            assert not sends and not recvs
            continue
        (cp,) = channels
        want = sorted((p, c) for p in range(world) if p != r for c in range(cp))
        assert sorted(sends) == want and sorted(recvs) == want, (world, r)
        assert cp >= 1
    # Senders and receivers alternate, so a partly resident grid still has both sides.
    assert all(x[3] == (b % 2 == 0) for b, x in enumerate(per_pair[0]))


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="world 2..8"):
        p2p_plan(10, 9)
    with pytest.raises(ValueError, match="rank in"):
        roles(4, 4)


# ---------------------------------------------------------------------------------------------
# coalesced batches (batch_isend_irecv in one launch)


def _check_batch(ops, world, sms):
    p = batch_plan(ops, world, sms)
    nxt = 0
    for (peer, is_send, nbytes), o in zip(ops, p["ops"]):
        alone = p2p_plan(nbytes, world, sms)
        # Cut as the message alone: a peer that posts it by itself agrees on every chunk.
        assert (o["blocks"], o["chunk"], o["nchunks"]) == (alone["blocks"], alone["chunk"], alone["nchunks"]), (ops, o)
        assert o["first_block"] == nxt, (ops, p)  # consecutive CTA ranges, in posting order
        nxt += o["blocks"]
    assert p["grid"] == nxt
    return p


@pytest.mark.parametrize("sms", (132, 108, 78))
def test_a_send_and_a_receive_of_any_size_fit_one_launch(sms):
    for nbytes in SIZES:
        p = _check_batch([(1, True, nbytes), (1, False, nbytes)], 2, sms)
        assert p["fits"] and p["grid"] <= sms - 4, (nbytes, p)


def test_small_messages_to_every_peer_fit_one_launch():
    for world in range(2, 9):
        for me in range(world):
            ops = [(q, s, 4099) for q in range(world) if q != me for s in (True, False)]
            p = _check_batch(ops, world, 132)
            assert p["fits"] and p["grid"] == len(ops), (world, p)


def test_a_batch_that_could_wait_on_unplaced_ctas_runs_op_by_op():
    # Three peers' 1 GiB sends and receives need 6 x 64 CTAs: more than the GPU holds at once.
    big = [(q, s, 1 << 30) for q in (1, 2, 3) for s in (True, False)]
    assert not _check_batch(big, 4, 132)["fits"]
    # Two sends to one peer share its channels: they must run one after the other.
    assert not _check_batch([(1, True, 100), (1, True, 100)], 2, 132)["fits"]
    assert _check_batch([(1, True, 100), (1, False, 100)], 2, 132)["fits"]
    # A message of no bytes still takes a CTA and its pair's channel: its empty chunk carries the
    # length, so a receive that expects bytes raises.
    p = _check_batch([(1, True, 0), (1, False, 0)], 2, 132)
    assert p["fits"] and p["grid"] == 2
    assert not _check_batch([(1, True, 0), (1, True, 5), (1, False, 3)], 2, 132)["fits"]


def test_batch_plan_rejects_bad_input():
    with pytest.raises(ValueError):
        batch_plan([(2, True, 10)], 2, 132)
    with pytest.raises(ValueError):
        batch_plan([(1, True, -1)], 2, 132)

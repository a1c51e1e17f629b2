// The CUDA engine's cost model: the only place that chooses an algorithm and a launch geometry.
// Pure C++ (compiled in CPU-only builds too). Every input is identical on all ranks (byte count,
// world size), so every rank makes the same choice: the kernels rely on it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/types.h"

namespace pycoll {
namespace gpu {

// How a message is cut for the CTAs: `nchunks` chunks of `chunk` elements (the last may be
// short); chunk c goes to CTA c % blocks.
struct Geometry {
  int blocks = 1;
  int64_t chunk = 0;
  int64_t nchunks = 0;
  int64_t seg = 0;  // plan_split only: elements of each channel's contiguous range
};

// CTAs a collective uses at most (the workspace has channels for cuda_ipc::kCollBlocks);
// PYCOLL_CUDA_MAX_BLOCKS overrides it per engine. Messages up to kSmallMessageBytes may be capped
// lower (PYCOLL_CUDA_SMALL_MAX_BLOCKS).
// docs/decisions/0002-slots-ctas-and-chunks.md
constexpr int kDefaultMaxBlocks = 64;
constexpr int kSmallMaxBlocks = 64;
constexpr int64_t kSmallMessageBytes = 4 << 20;

// Split one-shot all_reduce (pushing and reducing CTAs apart, cuda/kernels/one_shot.cuh), two ranks
// only: a one-shot all_reduce of at least kDefaultSplitMinBytes runs split, with chunks of
// kDefaultSplitChunkBytes (PYCOLL_CUDA_SPLIT_MIN_KIB / _CHUNK_KIB override).
// docs/decisions/0004-split-one-shot.md
constexpr int64_t kDefaultSplitMinBytes = int64_t(32) << 20;
constexpr int64_t kDefaultSplitChunkBytes = int64_t(128) << 10;
// The split one-shot runs claimed (cuda/kernels/one_shot_claimed.cuh: pushers take the next chunk from
// one counter; PYCOLL_CUDA_SPLIT_CLAIMED=0 turns it off) with chunks of this size.
// docs/decisions/0008-claimed-split.md
constexpr int64_t kDefaultClaimedChunkBytes = int64_t(64) << 10;
// ... and `auto` picks it (OneShot) over two-shot for two ranks from this size; below it the two
// are within noise of each other down to 16 MiB, so two-shot (the model's choice) stays there.
// docs/decisions/0004-split-one-shot.md
constexpr int64_t kTwoRankSplitAllReduceBytes = int64_t(128) << 20;
// ... and below that, the channel two-shot from kTwoRankChannelTwoShotAllReduceBytes for two ranks
// (the model puts its crossover with the fused one-shot a hair above; measured at it):
// docs/decisions/0006-two-shot-from-16-mib.md
// Below it two ranks run two-shot from kTwoRankTwoShotAllReduceBytes, measured with the LL128
// protocol (the registered protocol, cuda/ll128_two_shot.cpp): docs/decisions/0010-ll128-two-shot.md
// Where no registered two-shot protocol takes a size under kTwoRankChannelTwoShotAllReduceBytes
// (choose_all_reduce) one-shot runs there instead: the channel two-shot loses to it there.
constexpr int64_t kTwoRankChannelTwoShotAllReduceBytes = int64_t(16) << 20;
constexpr int64_t kTwoRankTwoShotAllReduceBytes = int64_t(4) << 20;
// ... and up to kTwoRankWideTwoShotMaxBytes it runs with kTwoRankWideTwoShotBlocks CTAs (64 leaders,
// 64 followers) unless PYCOLL_CUDA_MAX_BLOCKS is set (PYCOLL_CUDA_TWO_SHOT_BLOCKS overrides; the
// workspace then has 128 channels: 134 instead of 70 MiB per GPU for two ranks). Why: with 64 CTAs
// per-CTA store issue, not the link, bounds the leaders' first scatter while the followers wait.
// docs/decisions/0009-two-shot-waves.md
constexpr int kTwoRankWideTwoShotBlocks = 128;
constexpr int64_t kTwoRankWideTwoShotMaxBytes = int64_t(64) << 20;
// ... with each CTA's share cut into equal chunks of at most kTwoRankWideTwoShotChunkBytes unless
// PYCOLL_CUDA_CHUNK_KIB is set (any wide CTA count): up to 32 MiB one chunk per CTA as before, above
// it two (at 64 MiB two of 128 KiB instead of one of 256 KiB).
// docs/decisions/0009-two-shot-waves.md
constexpr int64_t kTwoRankWideTwoShotChunkBytes = int64_t(128) << 10;

// Three and four ranks (measured on 3 and 4 H100): two-shot (the LL128 two-shot, whose default
// limit there is this range's end) from kFewRanksTwoShotAllReduceBytes up to
// kFewRanksRingAllReduceBytes, the ring above it.
// docs/decisions/0012-three-and-four-rank-all-reduce.md
constexpr int64_t kFewRanksTwoShotAllReduceBytes = int64_t(512) << 10;
constexpr int64_t kFewRanksRingAllReduceBytes = int64_t(16) << 20;

// All-to-all uses this many channels (2 CTAs each: a sender and a receiver), fewer where the
// workspace has fewer or the GPU has less than two SMs per CTA: chunk j of a pair goes through
// channel j % channels on both ends, so the count cannot depend on a rank's own sizes.
// docs/decisions/0011-p2p-channels.md
constexpr int kAllToAllChannels = 64;

// Send/recv: at most kP2PMaxBlocks CTAs, chunks of at least kP2PMinChunkBytes (unless the message
// or the slot is smaller). Every CTA of these kernels fills an SM (512 threads x 128 registers), and
// a send and a receive (or an all_to_all) spin on each other across ranks: so that some CTA of
// every kernel can always be placed, a send and a receive together, and an all_to_all alone,
// leave kSmHeadroom SMs free.
// docs/decisions/0011-p2p-channels.md
constexpr int kP2PMaxBlocks = 64;
constexpr int64_t kP2PMinChunkBytes = 128 << 10;
// A chunk grows past kP2PMinChunkBytes (up to the slot) only where the CTAs still carry about this
// many each (the 4 KiB rounding leaves some with one fewer), so that a CTA's receive copies one
// chunk out while the next arrives: larger chunks add bandwidth from 64 MiB on two ranks, while a
// 16 MiB message keeps its two 128 KiB chunks per CTA.
// docs/decisions/0017-p2p-large-slots-and-all-to-all-own-slice.md
constexpr int64_t kP2PChunksPerBlock = 4;
constexpr int kSmHeadroom = 4;

// Cut a send/recv of `bytes`: chunks of at most `p2p_slot_bytes` (a multiple of 4 KiB but the
// last), none below kP2PMinChunkBytes unless the message or the slot is, spread over at most
// `max_blocks` (kP2PMaxBlocks, or PYCOLL_CUDA_P2P_MAX_BLOCKS) CTAs, no more than the workspace's
// `p2p_channels` or half the GPU's SMs less kSmHeadroom; chunks past kP2PMinChunkBytes only as
// kP2PChunksPerBlock says. Both ends call it with the same arguments (their layouts and GPUs are
// alike, the message length the same), so they agree on which CTA carries which chunk. A message
// of no bytes is one empty chunk on one CTA: a receive that expects bytes then learns the length
// (0) and raises, instead of waiting for its timeout.
Geometry plan_p2p(int64_t bytes, int64_t p2p_slot_bytes, int p2p_channels, int sms, int max_blocks = kP2PMaxBlocks);

// A receive that runs on at least this many CTAs is gated: a one-CTA kernel waits for its first
// chunk before the receive kernel launches (kernels::kP2PGate), so that a receive posted long
// before its send (pipeline schedules post them ahead) holds one SM, not 16-64, while the compute
// it overlaps runs. Smaller receives take few SMs and would pay the gate's extra launch.
// docs/decisions/0016-gated-receives.md
constexpr int kP2PGateMinBlocks = 16;
inline bool p2p_receive_gated(const Geometry& receive) { return receive.blocks >= kP2PGateMinBlocks; }

// A coalesced batch of sends and receives (batch_isend_irecv) in one launch: each message keeps
// plan_p2p's cut (a peer that posts it alone must agree), on consecutive CTAs. One launch holds
// every CTA of every message at once, so it is allowed only when nothing in it can wait on a CTA
// that is not placed: at most one send and one receive per peer (two of one direction share
// channels) and, together, no more CTAs than the GPU's SMs less kSmHeadroom. Otherwise the batch
// runs as separate sends and receives (`fits` false).
struct P2PBatchItem {
  int peer;
  bool is_send;
  int64_t bytes;
};
struct P2PBatchPlan {
  bool fits = false;
  int grid = 0;                    // CTAs of the launch
  std::vector<Geometry> geometry;  // per item, plan_p2p's
  std::vector<int> first_block;    // per item, its first CTA
};
P2PBatchPlan plan_p2p_batch(const std::vector<P2PBatchItem>& items, int max_ops, int64_t p2p_slot_bytes,
                            int p2p_channels, int sms, int max_blocks = kP2PMaxBlocks);
// Channels of an all_to_all of `nranks` (it launches two CTAs per channel): kAllToAllChannels, no
// more than the workspace's `coll_channels` or half the GPU's SMs less kSmHeadroom, but at least
// one per pair.
int all_to_all_channels(int nranks, int coll_channels, int sms);

// Cut `elems` elements of `elem_bytes` each. A chunk is at most `max_chunk_bytes` (a slot, or the
// PYCOLL_CUDA_CHUNK_KIB cap), is a multiple of 16 bytes (so chunk boundaries keep 16-byte
// alignment), and is at least kMinChunkBytes unless the whole message is smaller; at most
// `max_blocks` CTAs, and at most `small_max_blocks` for messages up to kSmallMessageBytes.
Geometry plan_geometry(int64_t elems, int64_t elem_bytes, int64_t max_chunk_bytes, int max_blocks,
                       int small_max_blocks = kSmallMaxBlocks);

// Cut `elems` elements for the split one-shot all_reduce (cuda/kernels/one_shot.cuh): `blocks` channels
// (at most `max_channels`, none with less than kMinChunkBytes), each a contiguous range of `seg`
// elements (a multiple of 16 bytes; the last range may be short), cut into chunks of `chunk`
// elements (at most `chunk_bytes`, a multiple of 32 bytes so that half a chunk keeps 16-byte
// alignment).
Geometry plan_split(int64_t elems, int64_t elem_bytes, int64_t chunk_bytes, int max_channels);

// Predicted time in microseconds of one call (2..8 ranks on one NVLink/NVSwitch host).
// `bytes`: all_reduce: the tensor; all_gather / reduce_scatter: one rank's share.
double predict_us(OpCode op, Algo algo, int64_t bytes, int nranks);

// Choices for Algo::Auto (op: AllReduce, ReduceScatter or AllGather; `bytes`: all_reduce: the
// tensor; all_gather / reduce_scatter: one rank's share). all_reduce: OneShot, TwoShot or Ring
// (Tree only when asked for). all_gather / reduce_scatter: OneShot ("direct": one hop, every rank
// writes every peer) or Ring. Where `pycoll-bench --calibrate` measured this machine
// (measured_choices.h) its table decides; elsewhere builtin_choice(), the rules and model below.
Algo choose(OpCode op, int64_t bytes, int nranks);
Algo builtin_choice(OpCode op, int64_t bytes, int nranks);

// The all_reduce `auto` of an engine whose two-shot protocols of a limited size (LL128) run up to
// `fast_two_shot_max_bytes` (limited_protocol_max_bytes): choose(), except that
// two ranks run one-shot where it picked two-shot below kTwoRankChannelTwoShotAllReduceBytes for a
// size LL128 does not cover (the channel two-shot loses to one-shot there).
Algo choose_all_reduce(int64_t bytes, int nranks, int64_t fast_two_shot_max_bytes);

// The two-rank two-shot all_reduce of `bytes` runs `wide_blocks` CTAs (the "wide" two-shot) with
// waves up to kTwoRankWideTwoShotMaxBytes; wide_blocks <= 0: never.
bool wide_two_shot(int64_t bytes, int nranks, bool waves, int wide_blocks);
// CTAs a two-shot all_reduce of `bytes` may use: `wide_blocks` where wide_two_shot, else `max_blocks`.
int two_shot_max_blocks(int64_t bytes, int nranks, bool waves, int max_blocks, int wide_blocks);
// The chunk cap of that two-shot (`bytes` the tensor, `seg_bytes` one rank's segment) where it is
// wide and the chunk was not set (chunk_set: PYCOLL_CUDA_CHUNK_KIB): a CTA's share of the segment in
// equal chunks of at most kTwoRankWideTwoShotChunkBytes (and at most `chunk_bytes`); else
// `chunk_bytes`.
int64_t two_shot_chunk_bytes(int64_t bytes, int64_t seg_bytes, int nranks, bool waves, int wide_blocks,
                             int64_t chunk_bytes, bool chunk_set);

}  // namespace gpu
}  // namespace pycoll

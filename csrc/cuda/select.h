// The CUDA engine's cost model: the only place that chooses an algorithm and a launch geometry.
// Pure C++ (compiled in CPU-only builds too). Every input is identical on all ranks (byte count,
// world size), so every rank makes the same choice: the kernels rely on it.
#pragma once

#include <cstdint>

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
// PYCOLL_CUDA_MAX_BLOCKS overrides it per engine. Measured on 2x H200 NVLink, 2026-11-26 (engine
// called directly, float32 sum): 64 CTAs instead of 32 cut all_reduce time by 15-27% from 16 MiB
// to 1 GiB and all_gather/reduce_scatter by 17-28% at 64-256 MiB. 128 CTAs (the workspace then
// doubles) were no better at 1-64 MiB on 2x H200 (benchmarks/results/2026-11-26-nvidia-h200-mid-*).
// Messages up to kSmallMessageBytes may be capped lower (PYCOLL_CUDA_SMALL_MAX_BLOCKS): 32 was the
// default until the same sweep found 64 faster for one-shot all_reduce at 1-4 MiB (4 MiB: 25.4
// against 27.1 us) and no slower elsewhere.
constexpr int kDefaultMaxBlocks = 64;
constexpr int kSmallMaxBlocks = 64;
constexpr int64_t kSmallMessageBytes = 4 << 20;

// One-shot all_reduce of at most this many bytes runs with the LL protocol (flags inside the data,
// kernels/ll_all_reduce.cuh); PYCOLL_CUDA_LL_MAX_KIB overrides it (up to cuda_ipc::kLLMaxBytes).
// Measured on 2x H200, CUDA graph replay (the kernel alone), LL against the channel protocol:
// 4.2-4.7 against 9.4-10.1 us up to 4 KiB, 6.6 against 11.6 us at 256 KiB, 8.3 against 12.2 at
// 512 KiB, 11.2 against 13.6 at 1 MiB (benchmarks/results/2026-11-26-nvidia-h200-ll{1024,0}-graph-np2.json).
constexpr int64_t kDefaultLLMaxBytes = int64_t(1) << 20;

// Split one-shot all_reduce (pushing and reducing CTAs apart, kernels/one_shot.cuh), two ranks
// only: a one-shot all_reduce of at least kDefaultSplitMinBytes runs split, with chunks of
// kDefaultSplitChunkBytes (PYCOLL_CUDA_SPLIT_MIN_KIB / _CHUNK_KIB override). Measured on 2x H200,
// eager dist.all_reduce, float32 (benchmarks/results/2026-11-26-nvidia-h200-s12c{3,4,6}-*-np2.json):
// against the fused one-shot it is faster from 32 MiB (32 MiB 115-125 vs 126-128 us, 64 MiB
// 209-220 vs 232-234 us, 128 MiB 397-412 vs 454-459 us) and no better at 4-16 MiB (4 MiB 27-31 vs
// 26 us); 64 KiB chunks lost at every size, 128 and 256 KiB tied, the taper changed nothing
// measurable.
constexpr int64_t kDefaultSplitMinBytes = int64_t(32) << 20;
constexpr int64_t kDefaultSplitChunkBytes = int64_t(128) << 10;
// The split one-shot runs claimed (kernels/one_shot_claimed.cuh: pushers take the next chunk from
// one counter; PYCOLL_CUDA_SPLIT_CLAIMED=0 turns it off) with chunks of this size. Measured on
// 2x H200, eager, float32, same launches (benchmarks/results/2026-11-27-nvidia-h200-c{1,2}-*.json):
// claimed 64 KiB against static 128 KiB: 16 MiB 70.8-73.1 vs 72.6-73.0 us, 64 MiB 213.8-215.5 vs
// 217.6-217.7, 128 MiB 399.1-400.9 vs 408.4-409.9, 256 MiB 771 vs 778-780; claimed 128 KiB chunks
// lost at 16-64 MiB (16 MiB 80.8-84.6 us), 256 KiB too (32 MiB 141.9), and cutting the last
// chunks finer (2-8x) made every size slower.
constexpr int64_t kDefaultClaimedChunkBytes = int64_t(64) << 10;
// ... and `auto` picks it (OneShot) over two-shot for two ranks from this size: 128 MiB 397-412 vs
// 403-416 us, 256 MiB 769 vs 789 us, 512 MiB 1515 vs 1563 us, 1 GiB 2989 vs 3149 us (359 against
// 341 GB/s); between 16 and 64 MiB the two were within run-to-run noise of each other, so two-shot
// (the model's choice) stays there.
constexpr int64_t kTwoRankSplitAllReduceBytes = int64_t(128) << 20;
// ... and below that, two-shot from this size for two ranks: the model puts the crossover with
// the fused one-shot a hair above 16 MiB, but in three launches at 16 MiB two-shot took 65.2-66.1
// us against 68.0-68.8 for the fused one-shot, while at 8 MiB the fused one-shot still won
// (38.4-39.0 against 41.1-41.7 us) (2x H200, eager, float32,
// benchmarks/results/2026-11-26-nvidia-h200-s13c5-algos{1,2,3}-np2.json).
// With the two-shot waves (kernels/two_shot.cuh, on for two ranks since 2026-11-27) two-shot took
// 64.8-65.0 us at 16 MiB (66.4-66.6 without), 210-211 at 64 MiB (220), 404 at 128 MiB (416-417),
// against 67.6-67.9 (fused one-shot), 212-214 and 399 (claimed split) in the same launches
// (benchmarks/results/2026-11-27-nvidia-h200-c4-*.json): these choices stand.
// That is the channel two-shot's crossover, kTwoRankChannelTwoShotAllReduceBytes. Below it two ranks
// run two-shot with the LL128 protocol (kDefaultTwoRankLL128MaxBytes), which wins from 4 MiB: 18.1
// against 24.2 us for one-shot at 4 MiB, 33.0 against 38.0 at 8 MiB, a host-bound tie at 2 MiB
// (16.9 against 17.2) (2x H200, eager, float32, benchmarks/results/2026-11-27-nvidia-h200-s18c2-ll128.json;
// sizes between 2 and 4 MiB not measured). An engine whose LL128 limit is below a size under
// kTwoRankChannelTwoShotAllReduceBytes runs one-shot there instead (cuda_engine.cu).
constexpr int64_t kTwoRankChannelTwoShotAllReduceBytes = int64_t(16) << 20;
constexpr int64_t kTwoRankTwoShotAllReduceBytes = int64_t(4) << 20;
// ... and up to kTwoRankWideTwoShotMaxBytes it runs with kTwoRankWideTwoShotBlocks CTAs (64 leaders,
// 64 followers) unless PYCOLL_CUDA_MAX_BLOCKS is set (PYCOLL_CUDA_TWO_SHOT_BLOCKS overrides; the
// workspace then has 128 channels: 134 instead of 70 MiB per GPU for two ranks). Why: the traces
// showed the 32 leaders of 64 CTAs pushing their first scatter at only ~262 GB/s (per-CTA store
// issue, not the link, bounds it) while the followers wait. Measured on 2x H200, eager, float32,
// alternating in one launch (benchmarks/results/2026-11-27-nvidia-h200-s16c5-*.json): 128 CTAs
// 16 MiB 62.4 / 63.1 us against 64.4-65.8 with 64 CTAs, 32 MiB 112.5 / 113.0 against 116.9-117.3,
// 64 MiB 210.1 / 210.8 against 210.3-211.2 (a tie, hence the bound); 112 CTAs were slower.
constexpr int kTwoRankWideTwoShotBlocks = 128;
constexpr int64_t kTwoRankWideTwoShotMaxBytes = int64_t(64) << 20;
// ... with each CTA's share cut into equal chunks of at most kTwoRankWideTwoShotChunkBytes unless
// PYCOLL_CUDA_CHUNK_KIB is set (any wide CTA count): up to 32 MiB one chunk per CTA as before, above
// it two (at 64 MiB two of 128 KiB instead of one of 256 KiB). Measured on 2x H200, eager, float32,
// alternating, median of 3 rounds each (benchmarks/results/2026-11-27-nvidia-h200-s17c4-*.json):
// 64 MiB 206.7 / 206.3 us against 209.8-210.2 (1.23-1.24x NCCL against 1.21-1.22x); 32 MiB
// unchanged; sizes between 32 and 64 MiB not measured.
constexpr int64_t kTwoRankWideTwoShotChunkBytes = int64_t(128) << 10;

// Two-shot all_reduce of at most this many bytes runs with the LL128 protocol on two ranks (flags
// inside 128-byte lines, kernels/ll128_two_shot.cuh); PYCOLL_CUDA_LL128_MAX_KIB overrides it, for
// any world size (default 0 there: not measured). The workspace grows by about 1.07x this for two
// ranks (the whole message's lines, both phases). With up to cuda_ipc::kLL128Blocks CTAs (the workspace's
// per-CTA words; PYCOLL_CUDA_LL128_BLOCKS lowers it), each at least
// kLL128MinLinesPerBlock lines (a row of 64) of every segment. Measured on 2x H200, eager, float32,
// LL128 against the channel two-shot in the same launch, median of 3 rounds
// (benchmarks/results/2026-11-27-nvidia-h200-s18c2-{ll128,chan}.json): 4 MiB 18.1 against 29.2 us,
// 8 MiB 33.0 against 39.9, 16 MiB 61.0 against 62.1, but 32 MiB 119.9 against 111.9 and 64 MiB
// 230.5 against 205.8: LL128 moves at most ~310 GB/s of lines (290 of payload) where the channel
// protocol reaches ~340-360, so it pays only while the channel protocol's fixed costs dominate.
constexpr int64_t kDefaultTwoRankLL128MaxBytes = int64_t(16) << 20;
constexpr int64_t kLL128MinLinesPerBlock = 64;

// All-to-all always launches this many CTAs: chunk j of a pair goes through CTA j % kAllToAllBlocks
// on both ends, so the count cannot depend on a rank's own sizes. Provisional (not measured).
constexpr int kAllToAllBlocks = 16;

// Cut `elems` elements of `elem_bytes` each. A chunk is at most `max_chunk_bytes` (a slot, or the
// PYCOLL_CUDA_CHUNK_KIB cap), is a multiple of 16 bytes (so chunk boundaries keep 16-byte
// alignment), and is at least kMinChunkBytes unless the whole message is smaller; at most
// `max_blocks` CTAs, and at most `small_max_blocks` for messages up to kSmallMessageBytes.
Geometry plan_geometry(int64_t elems, int64_t elem_bytes, int64_t max_chunk_bytes, int max_blocks,
                       int small_max_blocks = kSmallMaxBlocks);

// Cut `elems` elements for the split one-shot all_reduce (kernels/one_shot.cuh): `blocks` channels
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

// The LL128 limit of an engine without PYCOLL_CUDA_LL128_MAX_KIB: kDefaultTwoRankLL128MaxBytes for
// two ranks, 0 (off) otherwise.
int64_t default_ll128_max_bytes(int nranks);
// The all_reduce `auto` of an engine whose LL128 limit is `ll128_max_bytes`: choose(), except that
// two ranks run one-shot where it picked two-shot below kTwoRankChannelTwoShotAllReduceBytes for a
// size LL128 does not cover (the channel two-shot loses to one-shot there).
Algo choose_all_reduce(int64_t bytes, int nranks, int64_t ll128_max_bytes);

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

// Model constants, exposed for docs/logging.
struct CostConstants {
  double launch_us;
  double hop_us;
  double link_gbps;
  double hbm_gbps;
  int64_t min_chunk_bytes;
};
const CostConstants& cost_constants();

}  // namespace gpu
}  // namespace pycoll

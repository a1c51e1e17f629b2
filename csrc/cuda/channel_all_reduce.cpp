// The channel protocol of all_reduce (cuda/kernels/channel.cuh: slots with separate flags and
// credits), registered with the CUDA engine (cuda/all_reduce_registry.h) last by priority: it runs
// every schedule (one-shot, split one-shot, two-shot, ring, double binary tree) at any size, where
// no faster protocol takes the call. It has no region of its own: it uses the workspace's
// collective channels. Its settings are the engine's (engine_limits.h). Launcher: cuda/launch.cu.
#include <algorithm>

#include "common/arith.h"
#include "cuda/all_reduce_plan.h"
#include "cuda/all_reduce_registry.h"
#include "cuda/engine_limits.h"
#include "cuda/select.h"
#include "transport/cuda_ipc/layout.h"

namespace pycoll {
namespace gpu {
namespace {

using cuda_ipc::CheckPlan;
using kernels::ReduceMode;

void use_geometry(AllReducePlan& p, const Geometry& g) {
  p.grid = g.blocks;
  p.chunk = g.chunk;
  p.nchunks = g.nchunks;
}

// One-shot. Two ranks from split_min_bytes: pushing and reducing CTAs apart (one_shot.cuh),
// measured there only (docs/decisions/0004-split-one-shot.md); with more ranks one-shot moves
// (n-1)x the bytes and auto never picks it for large messages anyway.
void plan_one_shot(AllReducePlan& p, int64_t count, int64_t es, const EngineLimits& l) {
  p.mode = ReduceMode::AllReduceOneShot;
  p.check = CheckPlan::OneShot;
  const int split_channels = std::min(l.max_blocks, l.sms / 2);
  if (l.nranks != 2 || count * es < l.split_min_bytes || split_channels < 1) {
    use_geometry(p, plan_geometry(count, es, l.chunk_bytes, l.max_blocks, l.small_max_blocks));
    return;
  }
  p.mode = ReduceMode::AllReduceOneShotSplit;
  // Never launched early: with its CTAs placed while the kernel before it drained, its 2C CTAs
  // (all but a few SMs) ran longer. docs/decisions/0005-early-launch.md
  p.early_ok = false;
  const int64_t claimed_chunk = l.claimed_chunk_bytes / es;  // a multiple of 4 KiB: whole elements
  const int64_t claimed_chunks = ceil_div(count, claimed_chunk);
  if (l.split_claimed && claimed_chunks <= cuda_ipc::kMaxClaimedChunks) {
    // Pushers claim chunks from one counter (cuda/kernels/one_shot_claimed.cuh).
    p.variant = "split-claimed";
    p.check = CheckPlan::SplitClaimed;
    p.flags = kernels::kArgClaimed;
    p.chunk = claimed_chunk;
    p.nchunks = claimed_chunks;
    p.grid = 2 * int(std::min<int64_t>(split_channels, claimed_chunks));
    return;
  }
  p.variant = "split";
  p.check = CheckPlan::SplitStatic;
  p.flags = l.split_taper ? kernels::kArgTaper : 0;
  const Geometry g = plan_split(count, es, l.split_chunk_bytes, split_channels);
  p.seg = g.seg;
  p.chunk = g.chunk;
  p.nchunks = 0;  // per channel, from seg and chunk (cuda/kernels/one_shot.cuh: SplitChunks)
  p.grid = 2 * g.blocks;
}

void plan_two_shot(AllReducePlan& p, int64_t count, int64_t es, const EngineLimits& l) {
  p.seg = two_shot_segment(count, es, l.nranks);
  p.mode = ReduceMode::AllReduceTwoShot;
  p.check = CheckPlan::TwoShot;
  const int64_t bytes = count * es;
  if (l.two_shot_waves) {
    p.flags = kernels::kArgWaves;
    p.variant = wide_two_shot(bytes, l.nranks, true, l.two_shot_wide_blocks) ? "wide-waves" : "waves";
  }
  use_geometry(
      p, plan_geometry(p.seg, es,
                       two_shot_chunk_bytes(bytes, p.seg * es, l.nranks, l.two_shot_waves, l.two_shot_wide_blocks,
                                            l.chunk_bytes, l.chunk_set),
                       two_shot_max_blocks(bytes, l.nranks, l.two_shot_waves, l.max_blocks, l.two_shot_wide_blocks),
                       l.small_max_blocks));
}

bool plan(AllReducePlan& p, int64_t count, int64_t es, const EngineLimits& l, const ProtocolLimits&) {
  switch (p.algo) {
    case Algo::OneShot: plan_one_shot(p, count, es, l); return true;
    case Algo::TwoShot: plan_two_shot(p, count, es, l); return true;
    case Algo::Ring:
      p.mode = ReduceMode::AllReduceRing;
      p.check = CheckPlan::Ring;
      p.seg = two_shot_segment(count, es, l.nranks);
      use_geometry(p, plan_geometry(p.seg, es, l.chunk_bytes, l.max_blocks, l.small_max_blocks));
      return true;
    case Algo::Tree:
      p.mode = ReduceMode::AllReduceTree;
      p.check = CheckPlan::Tree;
      use_geometry(p, plan_geometry(count, es, l.chunk_bytes, l.max_blocks, l.small_max_blocks));
      return true;
    default: return false;
  }
}

// A split grid is pushing plus reducing CTAs, one pair per channel; every other grid one CTA per
// channel of the collective set.
bool fits(const AllReducePlan& p, int64_t, int64_t, int, int, const cuda_ipc::Layout& L) {
  const int channels = p.mode == ReduceMode::AllReduceOneShotSplit ? p.grid / 2 : p.grid;
  return channels >= 1 && channels <= L.coll.nblocks;
}

// NCCL's in-order binary tree (ncclGetBtree): rank 0 is the root with one child; every other rank
// has a parent and up to two children.
void btree(int n, int rank, int* up, int* d0, int* d1) {
  int bit = 1;
  for (bit = 1; bit < n; bit <<= 1)
    if (bit & rank) break;
  if (rank == 0) {
    *up = -1;
    *d0 = -1;
    *d1 = n > 1 ? bit >> 1 : -1;
    return;
  }
  int u = (rank ^ bit) | (bit << 1);
  if (u >= n) u = rank ^ bit;
  *up = u;
  int lowbit = bit >> 1;
  *d0 = lowbit == 0 ? -1 : rank - lowbit;
  int down1 = lowbit == 0 ? -1 : rank + lowbit;
  while (down1 >= n) {
    lowbit >>= 1;
    down1 = lowbit == 0 ? -1 : rank + lowbit;
  }
  *d1 = down1;
}

// NCCL's double binary tree (ncclGetDtree): tree 1 is tree 0 mirrored (even n) or shifted by one
// (odd n), so that a rank is an inner node in at most one of them.
void dtree(int n, int rank, int parent[2], int child[2][2]) {
  btree(n, rank, &parent[0], &child[0][0], &child[0][1]);
  int u, a, b;
  if (n % 2 == 1) {
    btree(n, (rank - 1 + n) % n, &u, &a, &b);
    auto map = [n](int x) { return x < 0 ? -1 : (x + 1) % n; };
    parent[1] = map(u);
    child[1][0] = map(a);
    child[1][1] = map(b);
  } else {
    btree(n, n - 1 - rank, &u, &a, &b);
    auto map = [n](int x) { return x < 0 ? -1 : n - 1 - x; };
    parent[1] = map(u);
    child[1][0] = map(a);
    child[1][1] = map(b);
  }
}

// Two-shot and ring write segment q of the output at q * seg; the tree needs this rank's place.
void prepare(kernels::ReduceArgs& a, const AllReducePlan& p) {
  if (p.mode == ReduceMode::AllReduceTwoShot || p.mode == ReduceMode::AllReduceRing) {
    a.out_stride = a.seg;
  } else if (p.mode == ReduceMode::AllReduceTree) {
    int parent[2];
    int child[2][2];
    dtree(a.h.nranks, a.h.rank, parent, child);
    for (int t = 0; t < 2; ++t) {
      a.tree_parent[t] = parent[t];
      a.tree_child[t][0] = child[t][0];
      a.tree_child[t][1] = child[t][1];
    }
  }
}

ProtocolLimits read_limits(int, int sms) { return {kAnySize, sms}; }
SettingList agreement(const ProtocolLimits&) { return {}; }  // the engine's own settings

AllReduceProtocol registration() {
  AllReduceProtocol p;
  p.name = kChannelProtocolName;
  p.algos = algo_bit(Algo::OneShot) | algo_bit(Algo::TwoShot) | algo_bit(Algo::Ring) | algo_bit(Algo::Tree);
  p.priority = 100;  // after every protocol of a limited size
  p.read_limits = &read_limits;
  p.agreement = &agreement;
  p.plan = &plan;
  p.fits = &fits;
  p.prepare = &prepare;
  return p;
}

[[maybe_unused]] const bool kRegistered = register_all_reduce_protocol(registration());

}  // namespace
}  // namespace gpu
}  // namespace pycoll

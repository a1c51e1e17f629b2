#include "cuda/all_reduce_plan.h"

#include <algorithm>
#include <stdexcept>

#include "common/arith.h"
#include "cuda/all_reduce_registry.h"
#include "cuda/select.h"
#include "transport/cuda_ipc/layout.h"

namespace pycoll {
namespace gpu {

const char* AllReducePlan::protocol_name() const {
  switch (protocol) {
    case Protocol::None: return "none";
    case Protocol::Channel: return "channel";
    case Protocol::LL: return "ll";
    case Protocol::Registered: return all_reduce_protocols().at(size_t(registered)).name;
  }
  return "unknown";
}

std::string AllReducePlan::describe() const {
  std::string s = std::string(algo == Algo::Tree ? "double_binary_tree" : algo_name(algo)) + " " + protocol_name();
  if (*variant) s += std::string(" ") + variant;
  if (protocol == Protocol::None) return s;
  s += " grid=" + std::to_string(grid);
  if (chunk > 0) s += " chunk=" + std::to_string(chunk);
  if (seg > 0) s += " seg=" + std::to_string(seg);
  return s;
}

namespace {

using cuda_ipc::CheckPlan;
using kernels::ReduceMode;

void use_geometry(AllReducePlan& p, const Geometry& g) {
  p.grid = g.blocks;
  p.chunk = g.chunk;
  p.nchunks = g.nchunks;
}

// One-shot of a message too large for LL. Two ranks from split_min_bytes: pushing and reducing
// CTAs apart (one_shot.cuh), measured there only (docs/decisions/0004-split-one-shot.md); with
// more ranks one-shot moves (n-1)x the bytes and auto never picks it for large messages anyway.
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
    // Pushers claim chunks from one counter (kernels/one_shot_claimed.cuh).
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
  p.nchunks = 0;  // per channel, from seg and chunk (kernels/one_shot.cuh: SplitChunks)
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

// A registered protocol of the plan's algorithm that takes the call (the first by priority).
bool plan_registered(AllReducePlan& p, int64_t count, int64_t es, const EngineLimits& l) {
  const auto& protocols = all_reduce_protocols();
  for (size_t i = 0; i < protocols.size(); ++i) {
    const AllReduceProtocol& r = protocols[i];
    if (r.algo != p.algo || l.protocols.at(i).max_bytes <= 0) continue;
    AllReducePlan q = p;
    if (!r.plan(q, count, es, l, l.protocols[i])) continue;
    q.protocol = Protocol::Registered;
    q.registered = int(i);
    q.check = static_cast<CheckPlan>(r.check_code);
    p = q;
    return true;
  }
  return false;
}

}  // namespace

int64_t two_shot_segment(int64_t count, int64_t es, int nranks) { return round_up(ceil_div(count, nranks), 16 / es); }

AllReducePlan plan_all_reduce(int64_t count, int64_t es, Algo requested, const EngineLimits& l) {
  AllReducePlan p;
  const int64_t bytes = count * es;
  p.algo =
      requested == Algo::Auto ? choose_all_reduce(bytes, l.nranks, registered_max_bytes(l, Algo::TwoShot)) : requested;
  if (count == 0 || l.nranks == 1) return p;  // Protocol::None
  p.protocol = Protocol::Channel;
  if (plan_registered(p, count, es, l)) return p;
  switch (p.algo) {
    case Algo::OneShot:
      if (bytes <= l.ll_max_bytes) {
        // Small messages: one CTA per 16 KiB region of the LL buffers (kernels/ll_all_reduce.cuh).
        p.protocol = Protocol::LL;
        p.check = CheckPlan::LL;
        p.grid = int(ceil_div(bytes, cuda_ipc::kLLBlockPayloadBytes));
      } else {
        plan_one_shot(p, count, es, l);
      }
      return p;
    case Algo::TwoShot: plan_two_shot(p, count, es, l); return p;
    case Algo::Ring:
      p.mode = ReduceMode::AllReduceRing;
      p.check = CheckPlan::Ring;
      p.seg = two_shot_segment(count, es, l.nranks);
      use_geometry(p, plan_geometry(p.seg, es, l.chunk_bytes, l.max_blocks, l.small_max_blocks));
      return p;
    case Algo::Tree:
      p.mode = ReduceMode::AllReduceTree;
      p.check = CheckPlan::Tree;
      use_geometry(p, plan_geometry(count, es, l.chunk_bytes, l.max_blocks, l.small_max_blocks));
      return p;
    default: break;
  }
  throw std::invalid_argument(std::string("the CUDA engine has no all_reduce algorithm '") + algo_name(p.algo) + "'");
}

}  // namespace gpu
}  // namespace pycoll

// The word every message slot carries next to its data, which the receiver compares with its own
// before it reads the slot (channel.cuh: acquire; ll_all_reduce.cuh: the header line).
//   p2p:         the total length of the message in bytes (a recv of another size fails).
//   collectives: what every rank must have called: op, element type, reduce op, root, element
//                count, and the plan (algorithm and protocol) the rank runs it with. Ranks that
//                called a collective with different sizes (or dtypes, ops, roots), or that chose
//                different algorithms for it (PYCOLL_ALGO or set_algo() on some ranks only), then
//                fail with an error that names both calls, instead of returning garbage or timing
//                out. All-to-all carries each pair's byte count instead (with_pair_bytes).
// Collective layout: op 8 bits | dtype 4 | reduce op 4 | root 4 | plan 4 | count 40 (up to 1 Ti
// elements). No torch, no CUDA headers.
#pragma once

#include <cstdint>
#include <string>

#include "transport/cuda_ipc/layout.h"  // PYCOLL_HD

namespace pycoll {
namespace cuda_ipc {

constexpr int kCheckCountBits = 40;
constexpr int kCheckPlanShift = kCheckCountBits;
constexpr int kCheckRootShift = kCheckCountBits + 4;

// How a rank runs a collective; two ranks whose plans differ would exchange messages of
// different shapes.
enum class CheckPlan : int {
  Unspecified = 0,  // ops with one plan (broadcast, all-to-all, barrier)
  OneShot = 1,      // channel protocol, every rank pushes its input to every peer
  TwoShot = 2,
  Ring = 3,
  Tree = 4,
  SplitStatic = 5,   // split one-shot, each channel a fixed range (cuda/kernels/one_shot.cuh)
  SplitClaimed = 6,  // split one-shot, chunks claimed from one counter (cuda/kernels/one_shot_claimed.cuh)
  LL = 7,            // one-shot with flags inside the data (cuda/kernels/ll_all_reduce.cuh)
  Direct = 8,        // one hop: reduce-scatter, all-gather and reduce
  // 9..13: the registered all_reduce protocols' codes (cuda/all_reduce_registry.h); the LL128
  // two-shot has 9.
  OtherSchedule = 14,  // a receiver's name for a sender that runs another schedule program (cuda/schedule_kernel.h)
  Schedule = 15,       // a schedule program
};
constexpr int kFirstRegisteredCheckPlan = 9;
constexpr int kLastRegisteredCheckPlan = 13;

PYCOLL_HD uint64_t collective_check_word(int op, int dtype, int reduce_op, int root, int64_t count,
                                         CheckPlan plan = CheckPlan::Unspecified) {
  const uint64_t mask = (uint64_t(1) << kCheckCountBits) - 1;
  return (uint64_t(op & 0xff) << 56) | (uint64_t(dtype & 0xf) << 52) | (uint64_t(reduce_op & 0xf) << 48) |
         (uint64_t(root & 0xf) << kCheckRootShift) | (uint64_t(int(plan) & 0xf) << kCheckPlanShift) |
         (uint64_t(count) & mask);
}

// All-to-all: the word the messages of one pair carry, the call's word (whose count is 0) with the
// pair's byte count: the sizes may differ between pairs, never between the two ends of one.
PYCOLL_HD uint64_t with_pair_bytes(uint64_t word, int64_t bytes) {
  const uint64_t mask = (uint64_t(1) << kCheckCountBits) - 1;
  return (word & ~mask) | (uint64_t(bytes) & mask);
}

struct CollectiveCheck {
  int op, dtype, reduce_op, root, plan;
  int64_t count;
};

inline CollectiveCheck decode_check_word(uint64_t w) {
  return CollectiveCheck{int(w >> 56),
                         int((w >> 52) & 0xf),
                         int((w >> 48) & 0xf),
                         int((w >> kCheckRootShift) & 0xf),
                         int((w >> kCheckPlanShift) & 0xf),
                         int64_t(w & ((uint64_t(1) << kCheckCountBits) - 1))};
}

// "all_reduce of 1000 elements of float32 (sum), two-shot": what a rank called, for error
// messages (check_word.cpp; plain C++, tested without a GPU).
std::string describe_check(const CollectiveCheck& c);
const char* check_plan_name(int plan);
// A registered protocol's code and name (cuda/all_reduce_registry.cpp does this for each), and
// whether a code has a name already.
void register_check_plan_name(int plan, const char* name);
bool check_plan_taken(int plan);

}  // namespace cuda_ipc
}  // namespace pycoll

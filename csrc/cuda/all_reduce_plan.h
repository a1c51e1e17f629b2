// The CUDA engine's all_reduce plan: the one place that turns (size, element size, the requested
// algorithm, the engine's limits) into what is launched. The launch, the check word and the
// PYCOLL_DEBUG log line all come from this value, so the log names what ran. Plain C++ (compiled
// in CPU-only builds too), tested directly (tests/test_cuda_plan.py through _C.cuda_all_reduce_plan).
//
// Every input is identical on all ranks (the limits are compared at engine start), so every rank
// plans the same launch: the kernels rely on it.
#pragma once

#include <cstdint>
#include <string>

#include "common/types.h"
#include "cuda/engine_limits.h"
#include "cuda/kernels/args.h"
#include "transport/cuda_ipc/check_word.h"

namespace pycoll {
namespace gpu {

struct AllReducePlan {
  Algo algo = Algo::Auto;  // OneShot, TwoShot, Ring or Tree (the double binary tree)
  // The protocol that runs it: its index in all_reduce_protocols() (all_reduce_registry.h); -1
  // where nothing is launched (an empty tensor, or one rank: a local copy).
  int protocol = -1;
  const char* variant = "";  // "split", "split-claimed", "waves", "wide-waves" or ""
  kernels::ReduceMode mode = kernels::ReduceMode::AllReduceOneShot;  // the channel protocol's schedule
  int32_t flags = 0;                                                 // kernels::kArg* bits (the engine adds kArgTrace)
  cuda_ipc::CheckPlan check = cuda_ipc::CheckPlan::Unspecified;
  int grid = 0;       // CTAs launched
  int64_t chunk = 0;  // elements per chunk (cuda/kernels/args.h)
  int64_t nchunks = 0;
  int64_t seg = 0;       // elements per segment (two-shot, ring, LL128) or split channel
  bool early_ok = true;  // may start before the previous kernel ends (early launch)

  // "none", or the protocol's name ("channel", "ll", "ll128").
  const char* protocol_name() const;
  // "twoshot ll128 grid=32 seg=..." for the debug log.
  std::string describe() const;
};

// Two-shot and ring cut the tensor into nranks segments whose starts stay 16-byte aligned.
int64_t two_shot_segment(int64_t count, int64_t elem_bytes, int nranks);

// `requested`: the user's algorithm (Auto: the cost model, select.h). The first protocol (by
// priority) that runs the chosen algorithm, is on, and whose plan rule takes the call runs it (the
// channel protocol takes every size last). Throws std::invalid_argument for a request the engine
// cannot run (not an all_reduce algorithm).
AllReducePlan plan_all_reduce(int64_t count, int64_t elem_bytes, Algo requested, const EngineLimits& limits);

}  // namespace gpu
}  // namespace pycoll

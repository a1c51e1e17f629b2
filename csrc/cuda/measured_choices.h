// The CUDA engine's `auto` choices as measured on this machine: `pycoll-bench --calibrate` times
// every algorithm at every size and writes, per (op, world size), which algorithm won where
// (pycollectives/bench/calibrate.py: cuda_choices); pycollectives.load_cost_model() installs the
// table here at import. Inside the measured size range, gpu::choose_* return the table's choice;
// outside it, and for ops or world sizes it does not cover, the built-in rules of select.cpp.
// Pure C++ (compiled in CPU-only builds too). Process-wide; every rank of a group must install the
// same table, which the CUDA engine checks at start-up (its digest is one of the compared settings).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/types.h"

namespace pycoll {
namespace gpu {

// From `from_bytes` on (up to the next step), `algo` wins. Bytes as gpu::choose_* count them: the
// tensor for all_reduce, one rank's share for all_gather and reduce_scatter.
struct MeasuredStep {
  int64_t from_bytes = 0;
  Algo algo = Algo::Auto;
};

// Replaces the table of (op, nranks): `steps` in increasing from_bytes, covering
// [steps[0].from_bytes, max_bytes]. Throws std::invalid_argument on an empty, unsorted or
// out-of-range table, an algorithm the op cannot run (all_gather / reduce_scatter: oneshot or
// ring), or an op without an `auto` choice.
void set_measured_steps(OpCode op, int nranks, const std::vector<MeasuredStep>& steps, int64_t max_bytes);
void clear_measured_steps();

// The table's choice for `bytes`, or nothing (no table for (op, nranks), or outside its range).
std::optional<Algo> measured_choice(OpCode op, int64_t bytes, int nranks);

// The installed tables for `nranks` ranks, in a fixed order ("" when none): what the ranks of a
// group compare when its CUDA engine starts. A table installed later is not compared again; ranks
// that then choose differently fail at that call on the check word, which carries the plan.
std::string measured_steps_digest(int nranks);

}  // namespace gpu
}  // namespace pycoll

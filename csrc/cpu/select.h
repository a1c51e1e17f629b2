// The cost model: the only place that chooses an algorithm when the user
// asked for "auto". time(algo) = alpha_us * sync_rounds + beta_us_per_byte * bytes,
// with one (alpha, beta) pair per (op, algorithm). Defaults were measured
// with pycoll-bench on the CPU engine (see docs/algorithms.md); the
// benchmark's --calibrate output replaces them through set_cost_entry().
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/types.h"

namespace pycoll {

struct CostEntry {
  OpCode op;
  Algo algo;
  double alpha_us;          // fixed cost per call
  double beta_us_per_byte;  // cost per byte of the op's buffer
};

// Picks the cheapest algorithm for op with `bytes` among those the engine
// implements for that op; `world` is the group size.
Algo select_algorithm(OpCode op, size_t bytes, int world);
// Which algorithms exist for an op on the CPU engine (requests for others fall back to auto).
bool algorithm_available(OpCode op, Algo algo);
void set_cost_entry(const CostEntry& e);
std::vector<CostEntry> cost_entries();

}  // namespace pycoll

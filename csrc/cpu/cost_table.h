// The CPU engine's algorithm costs: time(algo) = alpha_us + beta_us_per_byte * bytes, one (alpha,
// beta) pair per (op, algorithm). The plan (cpu/plan.h) asks it which algorithm `auto` runs. The
// built-in pairs and why: docs/decisions/0025-cpu-algorithm-cost-table.md. pycoll-bench
// --calibrate replaces them for a machine through set_cost_entry() (pycollectives.config).
#pragma once

#include <cstddef>
#include <vector>

#include "common/types.h"

namespace pycoll {

struct CostEntry {
  OpCode op;
  Algo algo;
  double alpha_us;          // fixed cost per call
  double beta_us_per_byte;  // cost per byte of the op's buffer
};

// The algorithm of op with the least cost for `bytes` among the table's entries for op; OneShot
// where the table has none, or for one rank.
Algo cheapest_algorithm(OpCode op, size_t bytes, int ranks);
// Replaces the entry of (e.op, e.algo), or adds it.
void set_cost_entry(const CostEntry& e);
std::vector<CostEntry> cost_entries();

}  // namespace pycoll

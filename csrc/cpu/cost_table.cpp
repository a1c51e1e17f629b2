#include "cpu/cost_table.h"

#include <limits>
#include <mutex>

namespace pycoll {

namespace {

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}

// The built-in pairs, for 2-4 ranks on one host (docs/decisions/0025-cpu-algorithm-cost-table.md):
// one-shot all_reduce below about 26 KiB, two-shot above; ring and tree never win on shared
// memory and run only when asked for.
std::vector<CostEntry>& table() {
  static std::vector<CostEntry> t = {
      {OpCode::AllReduce, Algo::OneShot, 4.0, 4.0e-4},     {OpCode::AllReduce, Algo::TwoShot, 8.0, 2.5e-4},
      {OpCode::AllReduce, Algo::Ring, 16.0, 3.5e-4},       {OpCode::AllReduce, Algo::Tree, 16.0, 5.0e-4},
      {OpCode::AllGather, Algo::OneShot, 4.0, 1.5e-4},     {OpCode::AllGather, Algo::Ring, 16.0, 2.5e-4},
      {OpCode::ReduceScatter, Algo::TwoShot, 4.0, 2.0e-4}, {OpCode::ReduceScatter, Algo::Ring, 16.0, 3.0e-4},
      {OpCode::Broadcast, Algo::OneShot, 4.0, 1.0e-4},     {OpCode::Broadcast, Algo::Tree, 16.0, 2.0e-4},
      {OpCode::Reduce, Algo::OneShot, 4.0, 2.0e-4},        {OpCode::Reduce, Algo::Tree, 16.0, 3.0e-4},
  };
  return t;
}

}  // namespace

Algo cheapest_algorithm(OpCode op, size_t bytes, int ranks) {
  if (ranks <= 1) return Algo::OneShot;
  std::lock_guard<std::mutex> g(table_mutex());
  Algo best = Algo::OneShot;
  double best_t = std::numeric_limits<double>::infinity();
  for (const auto& e : table()) {
    if (e.op != op) continue;
    const double t = e.alpha_us + e.beta_us_per_byte * static_cast<double>(bytes);
    if (t < best_t) {
      best_t = t;
      best = e.algo;
    }
  }
  return best;
}

void set_cost_entry(const CostEntry& e) {
  std::lock_guard<std::mutex> g(table_mutex());
  for (auto& x : table()) {
    if (x.op == e.op && x.algo == e.algo) {
      x = e;
      return;
    }
  }
  table().push_back(e);
}

std::vector<CostEntry> cost_entries() {
  std::lock_guard<std::mutex> g(table_mutex());
  return table();
}

}  // namespace pycoll

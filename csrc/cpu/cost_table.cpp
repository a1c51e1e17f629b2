#include "cpu/cost_table.h"

#include <atomic>
#include <cstdint>
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

// Bumped by every change of the table.
std::atomic<uint64_t> table_version{1};

// This thread's copy of the table, taken again after a change: an op plans without a lock.
const std::vector<CostEntry>& this_thread_table() {
  thread_local std::vector<CostEntry> copy;
  thread_local uint64_t copied = 0;
  const uint64_t v = table_version.load(std::memory_order_acquire);
  if (v != copied) {
    std::lock_guard<std::mutex> g(table_mutex());
    copy = table();
    copied = v;
  }
  return copy;
}

}  // namespace

Algo cheapest_algorithm(OpCode op, size_t bytes, int ranks) {
  if (ranks <= 1) return Algo::OneShot;
  Algo best = Algo::OneShot;
  double best_t = std::numeric_limits<double>::infinity();
  for (const auto& e : this_thread_table()) {
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
      table_version.fetch_add(1, std::memory_order_release);
      return;
    }
  }
  table().push_back(e);
  table_version.fetch_add(1, std::memory_order_release);
}

std::vector<CostEntry> cost_entries() {
  std::lock_guard<std::mutex> g(table_mutex());
  return table();
}

}  // namespace pycoll

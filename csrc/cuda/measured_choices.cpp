#include "cuda/measured_choices.h"

#include <atomic>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace pycoll {
namespace gpu {

namespace {

struct Table {
  std::vector<MeasuredStep> steps;
  int64_t max_bytes = 0;
};

// Read once per collective: `any` keeps the common case (no calibration) to one atomic load.
std::mutex& tables_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::pair<int, int>, Table>& tables() {
  static std::map<std::pair<int, int>, Table> t;
  return t;
}
std::atomic<bool> any_table{false};

bool runs_on_cuda(OpCode op, Algo a) {
  switch (op) {
    case OpCode::AllReduce: return a == Algo::OneShot || a == Algo::TwoShot || a == Algo::Ring || a == Algo::Tree;
    case OpCode::AllGather:
    case OpCode::ReduceScatter:
      return a == Algo::OneShot || a == Algo::Ring;  // the engine runs anything else as direct
    default: return false;
  }
}

}  // namespace

void set_measured_steps(OpCode op, int nranks, const std::vector<MeasuredStep>& steps, int64_t max_bytes) {
  if (op != OpCode::AllReduce && op != OpCode::AllGather && op != OpCode::ReduceScatter)
    throw std::invalid_argument("measured choices: only all_reduce, all_gather and reduce_scatter have an auto choice");
  if (nranks < 2) throw std::invalid_argument("measured choices: world size must be at least 2");
  if (steps.empty()) throw std::invalid_argument("measured choices: no steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].from_bytes < 0 || (i > 0 && steps[i].from_bytes <= steps[i - 1].from_bytes))
      throw std::invalid_argument("measured choices: step sizes must be non-negative and increasing");
    if (!runs_on_cuda(op, steps[i].algo))
      throw std::invalid_argument(std::string("measured choices: ") + op_name(op) + " cannot run " +
                                  algo_name(steps[i].algo) + " on the CUDA engine");
  }
  if (max_bytes < steps.back().from_bytes)
    throw std::invalid_argument("measured choices: max_bytes is below the last step");
  std::lock_guard<std::mutex> g(tables_mutex());
  tables()[{int(op), nranks}] = Table{steps, max_bytes};
  any_table.store(true, std::memory_order_release);
}

void clear_measured_steps() {
  std::lock_guard<std::mutex> g(tables_mutex());
  tables().clear();
  any_table.store(false, std::memory_order_release);
}

std::optional<Algo> measured_choice(OpCode op, int64_t bytes, int nranks) {
  if (!any_table.load(std::memory_order_acquire)) return std::nullopt;
  std::lock_guard<std::mutex> g(tables_mutex());
  auto it = tables().find({int(op), nranks});
  if (it == tables().end()) return std::nullopt;
  const Table& t = it->second;
  if (bytes < t.steps.front().from_bytes || bytes > t.max_bytes) return std::nullopt;
  Algo a = t.steps.front().algo;
  for (const MeasuredStep& s : t.steps) {
    if (s.from_bytes > bytes) break;
    a = s.algo;
  }
  return a;
}

std::string measured_steps_digest(int nranks) {
  std::lock_guard<std::mutex> g(tables_mutex());
  std::ostringstream out;
  for (const auto& [key, t] : tables()) {
    if (key.second != nranks) continue;
    out << op_name(static_cast<OpCode>(key.first)) << " x" << key.second << ":";
    for (const MeasuredStep& s : t.steps) out << " " << s.from_bytes << "=" << algo_name(s.algo);
    out << " ..." << t.max_bytes << ";";
  }
  return out.str();
}

}  // namespace gpu
}  // namespace pycoll

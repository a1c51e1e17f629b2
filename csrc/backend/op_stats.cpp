#include "backend/op_stats.h"

#include <cstdio>
#include <mutex>

#include "common/env.h"

namespace pycoll {

namespace {
std::mutex& stats_mutex() {
  static std::mutex m;
  return m;
}
// By the name's address: every caller passes a string literal, and comparing pointers costs an op
// nothing like building a std::string would. Literals of one text in several places are merged on read.
std::map<const char*, OpCounters>& table() {
  static std::map<const char*, OpCounters> t;
  return t;
}
}  // namespace

void record_op(const char* op, int64_t bytes, Algo algo, const OpTimer& timer, int rank, int size,
               const std::string& plan) {
  {
    std::lock_guard<std::mutex> g(stats_mutex());
    auto& c = table()[op];
    c.calls += 1;
    c.bytes += static_cast<uint64_t>(bytes > 0 ? bytes : 0);
  }
  if (rank >= 0 && debug_info_enabled()) {
    std::fprintf(stderr, "[pycoll %d/%d] %s algo=%s bytes=%lld time=%.1fus%s%s\n", rank, size, op, algo_name(algo),
                 static_cast<long long>(bytes), timer.elapsed_us(), plan.empty() ? "" : " plan=", plan.c_str());
  }
}

std::map<std::string, OpCounters> op_stats() {
  std::lock_guard<std::mutex> g(stats_mutex());
  std::map<std::string, OpCounters> by_name;
  for (const auto& [name, c] : table()) {
    OpCounters& sum = by_name[name];
    sum.calls += c.calls;
    sum.bytes += c.bytes;
  }
  return by_name;
}

void reset_op_stats() {
  std::lock_guard<std::mutex> g(stats_mutex());
  table().clear();
}

}  // namespace pycoll

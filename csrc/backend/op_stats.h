// Per-process counters of what each op moved (payload bytes this rank
// contributed), exposed as pycollectives.stats(), and the PYCOLL_DEBUG=INFO
// log line per op.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "common/env.h"
#include "common/types.h"

namespace pycoll {

// Times an op for its PYCOLL_DEBUG=INFO line; reads no clock when that line is off.
struct OpTimer {
  std::chrono::steady_clock::time_point start =
      debug_info_enabled() ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  double elapsed_us() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
};

struct OpCounters {
  uint64_t calls = 0;
  uint64_t bytes = 0;
};

// Counts one call; logs it when PYCOLL_DEBUG=INFO and rank >= 0, with the engine's `plan` where
// it described one (engine.h: Collective::plan_text).
void record_op(const char* op, int64_t bytes, Algo algo, const OpTimer& timer, int rank, int size,
               const std::string& plan = std::string());
std::map<std::string, OpCounters> op_stats();
void reset_op_stats();

}  // namespace pycoll

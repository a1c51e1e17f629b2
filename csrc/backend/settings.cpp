#include "backend/settings.h"

#include <atomic>
#include <stdexcept>

#include "common/env.h"

namespace pycoll {

namespace {
std::atomic<int>& algo_slot() {
  static std::atomic<int> slot{static_cast<int>(parse_algo(env_string("PYCOLL_ALGO", "auto")))};
  return slot;
}
}  // namespace

Algo algo_override() { return static_cast<Algo>(algo_slot().load(std::memory_order_relaxed)); }

void set_algo_override(Algo a) { algo_slot().store(static_cast<int>(a)); }

}  // namespace pycoll

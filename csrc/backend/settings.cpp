#include "backend/settings.h"

#include <atomic>
#include <stdexcept>

#include "common/setting.h"

namespace pycoll {

namespace {
const TextSetting kAlgo("PYCOLL_ALGO", "auto", "auto, ring, tree, oneshot, twoshot, hierarchical, flat", "backend", true, Audience::User,
                        "The algorithm of every collective that has a choice; auto asks the cost model. "
                        "hierarchical and flat choose the form of a group across hosts. "
                        "pycollectives.set_algo() changes it at run time. Checked across ranks per op.");

std::atomic<int>& algo_slot() {
  static std::atomic<int> slot{static_cast<int>(parse_algo(kAlgo.get()))};
  return slot;
}
}  // namespace

Algo algo_override() { return static_cast<Algo>(algo_slot().load(std::memory_order_relaxed)); }

void set_algo_override(Algo a) { algo_slot().store(static_cast<int>(a)); }

}  // namespace pycoll

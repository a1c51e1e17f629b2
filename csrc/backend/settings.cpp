#include "backend/settings.h"

#include <atomic>
#include <stdexcept>

#include "common/setting.h"

namespace pycoll {

namespace {
const TextSetting kAlgo("PYCOLL_ALGO", "auto", "auto, ring, tree, oneshot, twoshot, hierarchical, flat", "backend",
                        true, Audience::User,
                        "The algorithm of every collective that has a choice; auto asks the cost model. "
                        "hierarchical and flat choose the form of a group across hosts. "
                        "pycollectives.set_algo() changes it at run time. Checked across ranks per op.");
// Read by pycollectives/hosts.py when a group across hosts is made.
const TextSetting kInterHostBackend("PYCOLL_INTER_HOST_BACKEND", "auto", "auto, nccl, gloo", "backend", true,
                                    Audience::User,
                                    "Between hosts, for CUDA tensors: auto and nccl use NCCL sub-groups (auto: where "
                                    "CUDA is available); gloo sends them through host memory on Gloo. CPU tensors "
                                    "always use Gloo between hosts.");

std::atomic<int>& algo_slot() {
  static std::atomic<int> slot{static_cast<int>(parse_algo(kAlgo.get()))};
  return slot;
}
}  // namespace

Algo algo_override() { return static_cast<Algo>(algo_slot().load(std::memory_order_relaxed)); }

void set_algo_override(Algo a) { algo_slot().store(static_cast<int>(a)); }

}  // namespace pycoll

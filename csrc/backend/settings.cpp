#include "backend/settings.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <stdexcept>

#include "common/setting.h"

namespace pycoll {

namespace {
const TextSetting kAlgo("PYCOLL_ALGO", "auto",
                        "auto, ring, tree, oneshot, twoshot, hierarchical, flat, or a schedule program's name",
                        "backend", true, Audience::User,
                        "The algorithm of every collective that has a choice; auto asks the cost model. "
                        "hierarchical and flat choose the form of a group across hosts. Any other name is a "
                        "schedule program (pycollectives.register_algorithm, a shipped example such as "
                        "ring_all_reduce, or package.module:function, imported on first use) that ops of its "
                        "collective run, on CPU and CUDA tensors; ops of other collectives run auto. "
                        "pycollectives.set_algo() changes it at run time. Checked across ranks per op.");
// Read by pycollectives/hosts.py when a group across hosts is made.
const TextSetting kInterHostBackend("PYCOLL_INTER_HOST_BACKEND", "auto", "auto, nccl, gloo", "backend", true,
                                    Audience::User,
                                    "Between hosts, for CUDA tensors: auto and nccl use NCCL sub-groups (auto: where "
                                    "CUDA is available); gloo sends them through host memory on Gloo. CPU tensors "
                                    "always use Gloo between hosts.");

struct AlgoChoice {
  Algo algo = Algo::Auto;
  std::string schedule;  // Algo::Schedule: the program's name
};

AlgoChoice parse_choice(const std::string& name) {
  if (name.empty() || std::any_of(name.begin(), name.end(), [](unsigned char c) { return std::isspace(c); })) {
    if (name.empty()) return {};
    throw std::invalid_argument("unknown algorithm '" + name + "': a name has no spaces");
  }
  try {
    return {parse_algo(name), ""};
  } catch (const std::invalid_argument&) {
    return {Algo::Schedule, name};
  }
}

// The algorithm is read on every op: an atomic. The schedule's name only where it is one.
std::atomic<int>& algo_slot();
std::mutex& schedule_mu() {
  static std::mutex mu;
  return mu;
}
std::string& schedule_slot() {
  static std::string name;
  return name;
}
std::atomic<int>& algo_slot() {
  static std::atomic<int> slot{[] {
    const AlgoChoice c = parse_choice(kAlgo.get());
    std::lock_guard<std::mutex> lock(schedule_mu());
    schedule_slot() = c.schedule;
    return static_cast<int>(c.algo);
  }()};
  return slot;
}
}  // namespace

Algo algo_override() { return static_cast<Algo>(algo_slot().load(std::memory_order_relaxed)); }

std::string schedule_override() {
  algo_slot();  // PYCOLL_ALGO read first
  std::lock_guard<std::mutex> lock(schedule_mu());
  return schedule_slot();
}

void set_algo_override(const std::string& name) {
  const AlgoChoice c = parse_choice(name);
  algo_slot();
  std::lock_guard<std::mutex> lock(schedule_mu());
  schedule_slot() = c.schedule;
  algo_slot().store(static_cast<int>(c.algo));
}

}  // namespace pycoll

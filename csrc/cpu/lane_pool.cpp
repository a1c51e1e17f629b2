#include "cpu/lane_pool.h"

#include <algorithm>
#include <chrono>

#include "common/brief_spin.h"
#include "common/cpu_affinity.h"
#include "common/owned_thread.h"
#include "common/setting.h"
#include "transport/transport.h"

namespace pycoll {

namespace {

const IntSetting kCpuThreads("PYCOLL_CPU_THREADS", 0, 0, kMaxLanes, "cpu engine", false, Audience::User,
                             "Threads per rank for large CPU collectives; 0 = the CPUs in the process's affinity mask, "
                             "less one, divided by the ranks on the host. Ranks that differ use the smallest value.",
                             "0 (auto)");

// How long a worker (or the caller) spins for the next op (or the workers) before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(100);

template <typename Pred>
bool spin_for(Pred pred) {
  return spin_briefly(pred, kSpin);
}

}  // namespace

// One CPU of the host stays free: lanes spin on each other's counters, so a lane that the OS
// deschedules for another thread (the rank's Python thread, Gloo's, the kernel's) stalls every
// lane of every rank. docs/decisions/0026-cpu-pipeline-lanes-slots-and-steps.md
int auto_threads_per_rank(int cpus, int ranks_on_host) { return std::max(1, (cpus - 1) / std::max(1, ranks_on_host)); }

bool cpu_to_spare_per_rank(int ranks_on_host) { return allowed_cpu_count() >= 2 * std::max(1, ranks_on_host); }

int cpu_threads_per_rank(int ranks_on_host) {
  const int64_t configured = kCpuThreads.get();
  const int threads =
      configured > 0 ? static_cast<int>(configured) : auto_threads_per_rank(allowed_cpu_count(), ranks_on_host);
  return std::clamp(threads, 1, kMaxLanes);
}

LanePool::LanePool(int workers) {
  start_cv_.reserve(workers);
  for (int i = 0; i < workers; ++i) start_cv_.push_back(std::make_unique<std::condition_variable>());
  threads_.reserve(workers);
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { worker_main(i + 1); });
}

LanePool::~LanePool() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  for (auto& cv : start_cv_) cv->notify_all();
  for (auto& t : threads_) join_unless_current(t);
}

bool LanePool::has_lane(int lane, uint64_t seen) const {
  // generation_ is published after lanes_ (release): a newer generation shows its own lanes_, or a
  // later op's if this worker sat that one out; either way run() re-checks under mu_.
  return generation_.load(std::memory_order_acquire) != seen && lane < lanes_.load(std::memory_order_relaxed);
}

void LanePool::run(int lanes, const std::function<void(int)>& lane) {
  lanes = std::clamp(lanes, 1, workers() + 1);
  if (lanes > 1) {
    std::lock_guard<std::mutex> g(mu_);
    lane_fn_ = &lane;
    lanes_.store(lanes, std::memory_order_relaxed);
    running_.store(lanes - 1);
    error_ = nullptr;
    generation_.fetch_add(1, std::memory_order_release);
  }
  for (int w = 1; w < lanes; ++w) start_cv_[w - 1]->notify_one();
  std::exception_ptr mine;
  try {
    lane(0);
  } catch (...) {
    mine = std::current_exception();
  }
  if (lanes > 1) {
    spin_for([&] { return running_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> g(mu_);
    done_cv_.wait(g, [&] { return running_.load() == 0; });
    lane_fn_ = nullptr;
    if (!mine) mine = error_;
  }
  if (mine) std::rethrow_exception(mine);
}

void LanePool::worker_main(int lane) {
  // The caller waits for every lane of an op before it starts the next, so a worker never misses
  // an op it has a lane in: `seen` is the last generation it ran.
  uint64_t seen = 0;
  bool ran_last = false;  // only a worker the last op used spins for the next (a training step's buckets)
  std::condition_variable& start = *start_cv_[lane - 1];
  std::unique_lock<std::mutex> g(mu_);
  for (;;) {
    if (ran_last && !stop_ && !has_lane(lane, seen)) {
      g.unlock();
      spin_for([&] { return has_lane(lane, seen); });
      g.lock();
    }
    ran_last = false;
    start.wait(g, [&] { return stop_ || has_lane(lane, seen); });
    if (stop_) return;
    seen = generation_.load();
    const std::function<void(int)>* fn = lane_fn_;
    g.unlock();
    std::exception_ptr err;
    try {
      (*fn)(lane);
    } catch (...) {
      err = std::current_exception();
    }
    g.lock();
    ran_last = true;
    if (err && !error_) error_ = err;
    if (running_.fetch_sub(1) == 1) done_cv_.notify_all();
  }
}

}  // namespace pycoll

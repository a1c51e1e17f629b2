// Worker threads that run the lanes of one pipelined op (cpu/pipelined.h) at once.
//
// A rank that has cores to spare moves a large message faster with several threads: one
// thread's copies reach a fraction of the memory's bandwidth. Lane 0 runs on the caller, lanes
// 1.. on persistent workers, so an op pays a wake-up, not a thread start. The caller, and each
// worker after an op it ran, spin for a moment (kSpin) for the next before they sleep, because
// back-to-back ops (a training step's buckets) would otherwise pay a futex wake-up of tens of
// microseconds each; an op wakes only the workers it has lanes for, so a sleeping worker without
// a lane leaves its CPU to the lanes that run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pycoll {

class LanePool {
 public:
  explicit LanePool(int workers);
  ~LanePool();
  LanePool(const LanePool&) = delete;
  LanePool& operator=(const LanePool&) = delete;

  int workers() const { return static_cast<int>(threads_.size()); }
  // Runs lane(0) on the caller and lane(1..lanes-1) on the workers; returns when every lane has
  // returned and rethrows the first lane's exception. lanes <= workers() + 1.
  void run(int lanes, const std::function<void(int)>& lane);

 private:
  void worker_main(int lane);

  // Whether a generation newer than `seen` has a lane for this worker. Without mu_ only a hint
  // (a spinning worker's); the decision is taken again under mu_.
  bool has_lane(int lane, uint64_t seen) const;

  std::mutex mu_;
  // One per worker: an op wakes only the workers it has lanes for. A sleeping worker without a
  // lane stays asleep, so a 1 MiB op over 2 ranks (8 lanes of 128 KiB) offered 15 threads leaves
  // the other 7 CPUs per rank alone once they stop spinning after their last op.
  std::vector<std::unique_ptr<std::condition_variable>> start_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};  // written under mu_ after lanes_, read by spinning workers
  std::atomic<int> lanes_{0};
  std::atomic<int> running_{0};
  bool stop_ = false;
  const std::function<void(int)>* lane_fn_ = nullptr;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

// Threads one rank may use for a pipelined op: PYCOLL_CPU_THREADS if set, else
// auto_threads_per_rank(the CPUs this process may run on, ranks_on_host), at most kMaxLanes.
int cpu_threads_per_rank(int ranks_on_host);
// The host's CPUs less one, divided by the ranks sharing it, at least 1.
int auto_threads_per_rank(int cpus, int ranks_on_host);
// Whether each rank has a CPU beyond the one its op runs on (a caller may poll for completion
// there instead of sleeping, common/brief_spin.h).
bool cpu_to_spare_per_rank(int ranks_on_host);

}  // namespace pycoll

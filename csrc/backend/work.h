// Work objects handed back to torch.distributed.
//
// Completion happens in two steps on purpose: the engine marks the Work done
// (Work::wait returns) on its own thread, and a completion-pool thread then
// completes the Future, which runs user callbacks. A callback that issues and
// waits on another collective (torch's PowerSGD hook does) therefore never
// blocks the engine that must run that collective. wait() returns once the
// Future is marked completed too (Gloo and NCCL promise get_future().done()
// after wait()), without waiting for the callbacks. The Future is made only
// when asked for: a Work without one has no callbacks, so mark_done_and_settle() settles it
// on the engine thread and its waiter wakes once (docs/performance.md,
// "Per-call cost on CPU").
#pragma once

#include <atomic>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "backend/flight_recorder.h"

namespace pycoll {

class PycollWork : public c10d::Work {
 public:
  // The Future is made only when getFuture() asks for it (most callers never do): always for a
  // Work without devices, and with `lazy_future` for one with devices, where it is then completed
  // on the caller's current stream; only for ops that ran on that stream (the CUDA path of a
  // synchronous op).
  PycollWork(int rank, c10d::OpType type, std::string op_name, uint64_t seq, std::vector<at::Tensor> outputs,
             std::vector<c10::Device> devices, bool lazy_future = false);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return seq_; }
  // A receive from any source: the peer it came from (set before the Work is marked done).
  int sourceRank() const override;
  void set_source_rank(int rank) { source_rank_.store(rank); }

  // Engine side: the op finished (err == nullptr) or failed.
  void mark_done(std::exception_ptr err);
  // Completion side: completes the Future (runs its callbacks).
  void settle_future();
  // Both, from a thread that must not run user callbacks (an engine or channel thread): when no
  // Future exists yet nothing can run, so the Work settles here and wait() returns after one
  // wake-up; otherwise the completion pool settles it.
  void mark_done_and_settle(std::exception_ptr err);

  // Optional step run by wait() before returning (CUDA: make the caller's
  // stream wait on the op's end event).
  std::function<void()> on_wait;
  // Optional completion probe (CUDA: the end event has fired).
  std::function<bool()> query;
  // getFuture() first waits until the op ran (its error stays with the Work and the Future), so
  // the Future it hands out is complete and callbacks run at once, on the asking thread: an
  // asynchronous staged op of CUDA tensors (decision 0041). Set before the Work is handed out.
  bool ran_before_future = false;
  // How long wait() polls before it sleeps (0: not at all); set where the waiter has a CPU to spare.
  std::chrono::microseconds poll_before_sleep{0};
  // The op's flight-recorder entry (flight_recorder.h). It is completed when the op is marked done,
  // or, for an op with a completion probe (the device queue marks it done when enqueued), when
  // isCompleted() first sees the probe fire. A failure also asks for the group's dumps
  // (dump_watcher.h). Call before the op can complete, or right after: both orders record it.
  void track(const FrHandle& fr);

 private:
  std::string op_name_;
  uint64_t seq_;
  std::atomic<int> source_rank_{-1};
  std::vector<at::Tensor> outputs_;
  std::vector<c10::Device> devices_;
  std::atomic<bool> done_{false};  // completed_, readable without mutex_ (what wait() polls)
  bool profiled_ = false;          // torch.profiler recorded this op (set once, when made)
  FrHandle fr_;
  std::atomic<bool> fr_set_{false};  // fr_ is written; with done_, a Dekker pair: one side reports
  // Completes fr_'s entry (and reports a failure) once both it is set and the op is done.
  void report_to_recorder(const std::exception_ptr& err);
  std::mutex future_mu_;
  std::condition_variable settled_cv_;
  bool settled_ = false;  // settle_future() ran (what a lazy Future must show when made)
  c10::intrusive_ptr<c10::ivalue::Future> future_;

  c10::intrusive_ptr<c10::ivalue::Future> make_future() const;
  void complete(const c10::intrusive_ptr<c10::ivalue::Future>& f);
  // Ends torch.profiler's event of this op (when one was started), before record_outcome: a
  // waiter may leave the profiler's context as soon as the op looks complete, and the profiler
  // collects its events then (an event ended after that crashed it in disableProfiler).
  void end_profiling();
  // Records the outcome (what wait(), isCompleted() and a later getFuture() report).
  void record_outcome(std::exception_ptr err);
  // Wakes wait(): done_ for its poll, cv_ for its sleep; then reports the outcome `err` to the
  // flight recorder.
  void wake_waiters(const std::exception_ptr& err);
  // Blocks until settle_future() has marked the Future completed (not until its callbacks ran).
  void wait_future_marked();
};

}  // namespace pycoll

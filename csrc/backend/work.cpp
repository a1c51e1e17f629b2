#include "backend/work.h"

#include <ATen/core/jit_type.h>

#include <algorithm>

#include "backend/dump_watcher.h"
#include "backend/executor.h"
#include "common/brief_spin.h"
#include "common/check.h"

namespace pycoll {

namespace {

// What torch.profiler shows for each op, as ProcessGroupGloo ("gloo:all_reduce") and
// ProcessGroupNCCL ("nccl:all_reduce") name theirs: c10d::Work records the event from
// construction until recordFunctionEndCallback_ runs (mark_done below).
const char* profiling_title(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "pycoll:broadcast";
    case c10d::OpType::ALLREDUCE: return "pycoll:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "pycoll:all_reduce_coalesced";
    case c10d::OpType::REDUCE: return "pycoll:reduce";
    case c10d::OpType::ALLGATHER:
    case c10d::OpType::_ALLGATHER_BASE: return "pycoll:all_gather";
    case c10d::OpType::ALLGATHER_COALESCED: return "pycoll:all_gather_coalesced";
    case c10d::OpType::GATHER: return "pycoll:gather";
    case c10d::OpType::SCATTER: return "pycoll:scatter";
    case c10d::OpType::REDUCE_SCATTER:
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "pycoll:reduce_scatter";
    case c10d::OpType::ALLTOALL_BASE:
    case c10d::OpType::ALLTOALL: return "pycoll:all_to_all";
    case c10d::OpType::SEND: return "pycoll:send";
    case c10d::OpType::RECV: return "pycoll:recv";
    case c10d::OpType::BARRIER: return "pycoll:barrier";
    case c10d::OpType::COALESCED: return "pycoll:coalesced";
    default: return "pycoll:unknown";
  }
}

}  // namespace

PycollWork::PycollWork(int rank, c10d::OpType type, std::string op_name, uint64_t seq, std::vector<at::Tensor> outputs,
                       std::vector<c10::Device> devices, bool lazy_future)
    : c10d::Work(rank, type, profiling_title(type)),
      op_name_(std::move(op_name)),
      seq_(seq),
      outputs_(std::move(outputs)),
      devices_(std::move(devices)) {
  if (!lazy_future && !devices_.empty()) future_ = make_future();
  profiled_ = static_cast<bool>(recordFunctionEndCallback_);  // c10d::Work sets it while a profiler records
}

c10::intrusive_ptr<c10::ivalue::Future> PycollWork::make_future() const {
  // The device list makes markCompleted record CUDA events and makes waiters
  // synchronise with them; without it, GPU callbacks would race.
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices_);
}

bool PycollWork::isCompleted() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (!completed_) return false;
  }
  if (!query) return true;
  const bool fired = query();
  if (fired && fr_set_.load()) FlightRecorder::get().completed(fr_);
  return fired;
}

void PycollWork::track(const FrHandle& fr) {
  if (!fr.recorded()) return;
  fr_ = fr;
  fr_set_.store(true);  // seq_cst, as done_ in wake_waiters: whichever side comes second reports
  if (done_.load()) report_to_recorder(exception());
}

void PycollWork::report_to_recorder(const std::exception_ptr& err) {
  if (!fr_set_.load()) return;
  if (!err) {
    if (!query) FlightRecorder::get().completed(fr_);
    return;
  }
  std::string why = "unknown error";
  try {
    std::rethrow_exception(err);
  } catch (const std::exception& e) {
    why = e.what();
  } catch (...) {}
  // c10::Error appends a C++ backtrace after the first line; the message is the first line.
  if (const auto nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
  FlightRecorder::get().completed(fr_, why.c_str());
  DumpWatcher::get().op_failed(fr_.pg_id, why);
}

bool PycollWork::isSuccess() const {
  std::lock_guard<std::mutex> g(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr PycollWork::exception() const {
  std::lock_guard<std::mutex> g(mutex_);
  return exception_;
}

std::vector<at::Tensor> PycollWork::result() { return outputs_; }

int PycollWork::sourceRank() const {
  const int r = source_rank_.load();
  TORCH_CHECK(r >= 0, op_name_, ": the source rank is known only for a receive from any source that completed");
  return r;
}

bool PycollWork::wait(std::chrono::milliseconds timeout) {
  spin_briefly(
      [&] { return done_.load(std::memory_order_acquire); },
      timeout == kNoTimeout ? poll_before_sleep : std::min(poll_before_sleep, std::chrono::microseconds(timeout)));
  {
    std::unique_lock<std::mutex> lk(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lk, [&] { return completed_; });
    } else if (!cv_.wait_for(lk, timeout, [&] { return completed_; })) {
      TORCH_CHECK(false, op_name_, ": Work.wait timed out: not done within its timeout (", timeout.count(), " ms, op #",
                  seq_, "); a peer may not have called this collective yet");
    }
    if (exception_) std::rethrow_exception(exception_);
  }
  wait_future_marked();
  if (on_wait) on_wait();
  return true;
}

void PycollWork::wait_future_marked() {
  c10::intrusive_ptr<c10::ivalue::Future> f;
  {
    std::unique_lock<std::mutex> lk(future_mu_);
    settled_cv_.wait(lk, [&] { return settled_; });
    f = future_;
  }
  // settle_future() is past its lock but may not have marked the Future yet. A CUDA Future is
  // marked before its Work is handed out, so this never synchronises streams.
  if (f && !f->completed()) f->wait();
}

c10::intrusive_ptr<c10::ivalue::Future> PycollWork::getFuture() {
  if (ran_before_future) {
    try {
      wait();
    } catch (const std::exception&) {
      // Completed with the error: whoever waits on the Work or the Future gets it.
    }
  }
  std::lock_guard<std::mutex> g(future_mu_);
  if (!future_) {
    future_ = make_future();
    if (settled_) complete(future_);  // no callback yet: nothing runs under the lock
  }
  return future_;
}

void PycollWork::end_profiling() {
  if (!profiled_) return;  // most ops: no lock taken
  std::function<void()> end;
  {
    std::lock_guard<std::mutex> g(mutex_);
    end.swap(recordFunctionEndCallback_);  // set only while torch.profiler records
  }
  if (end) end();
}

void PycollWork::record_outcome(std::exception_ptr err) {
  std::lock_guard<std::mutex> g(mutex_);
  completed_ = true;
  exception_ = err;
}

void PycollWork::wake_waiters(const std::exception_ptr& err) {
  done_.store(true);  // seq_cst: see track()
  report_to_recorder(err);
  cv_.notify_all();
}

void PycollWork::mark_done(std::exception_ptr err) {
  end_profiling();
  record_outcome(err);
  wake_waiters(err);
}

void PycollWork::mark_done_and_settle(std::exception_ptr err) {
  end_profiling();
  record_outcome(err);
  bool settled_here;
  {
    // After the outcome is recorded: a getFuture() from now on completes its Future with it.
    std::lock_guard<std::mutex> g(future_mu_);
    settled_here = !future_;
    if (settled_here) settled_ = true;
  }
  // Settled before the waiter wakes, so wait() does not sleep a second time for the Future.
  if (settled_here) settled_cv_.notify_all();
  wake_waiters(err);
  if (!settled_here) {
    auto self = c10::intrusive_ptr<PycollWork>::unsafe_reclaim_from_nonowning(this);  // callers hold a reference
    CompletionPool::instance().post([self] { self->settle_future(); });
  }
}

void PycollWork::settle_future() {
  c10::intrusive_ptr<c10::ivalue::Future> f;
  {
    std::lock_guard<std::mutex> g(future_mu_);
    settled_ = true;
    f = future_;
  }
  settled_cv_.notify_all();
  if (f) complete(f);  // outside the lock: completing runs the callbacks
}

void PycollWork::complete(const c10::intrusive_ptr<c10::ivalue::Future>& f) {
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> g(mutex_);
    err = exception_;
  }
  if (err) {
    f->setError(err);
  } else {
    f->markCompleted(c10::IValue(outputs_));
  }
}

}  // namespace pycoll

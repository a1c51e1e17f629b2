#include "backend/cuda_op_watcher.h"

#include <cuda_runtime_api.h>

namespace pycoll {

namespace {

// True once the event has fired; an error (the context is going away) counts as fired, so that
// nothing waits on it forever.
bool fired(const EventPool::Event& e) {
  const cudaError_t err = cudaEventQuery(e.get());
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // a not-ready query is not an error to report later
    return false;
  }
  if (err != cudaSuccess) (void)cudaGetLastError();
  return true;
}

}  // namespace

bool CudaOpWatcher::timing() {
  static const bool on = FlightRecorder::gpu_timing_from_settings();
  return on;
}

CudaOpWatcher::CudaOpWatcher() { pending_.reserve(1024); }

CudaOpWatcher::~CudaOpWatcher() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CudaOpWatcher::watch(const FrHandle& op, int device, EventPool::Event start, EventPool::Event end) {
  if (!op.recorded()) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) return;
    pending_.push_back({op, device, std::move(start), std::move(end)});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    wake = idle_;  // a polling thread takes it within kPollInterval: no wake-up call on the hot path
  }
  if (wake) wake_.notify_one();
}

void CudaOpWatcher::loop() {
  FlightRecorder& recorder = FlightRecorder::get();
  std::vector<Pending> batch;  // taken out of pending_ while the events are queried
  batch.reserve(1024);
  int current_device = -1;  // this thread's: never a context on a GPU the group does not use
  for (;;) {
    {
      std::unique_lock<std::mutex> g(mu_);
      if (batch.empty()) {
        idle_ = true;
        wake_.wait(g, [this] { return stop_ || !pending_.empty(); });
        idle_ = false;
      }
      if (stop_) return;
      for (auto& p : pending_) batch.push_back(std::move(p));
      pending_.clear();
    }
    // Every pending op's events, queried until its end has fired (a few per op while it runs).
    size_t kept = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      Pending& p = batch[i];
      if (p.device != current_device && cudaSetDevice(p.device) == cudaSuccess) current_device = p.device;
      if (!p.started && fired(p.start)) {
        p.started = true;
        recorder.started(p.op);
      }
      if (p.started && fired(p.end)) {
        if (timing()) {
          float ms = 0;
          if (cudaEventElapsedTime(&ms, p.start.get(), p.end.get()) == cudaSuccess) {
            recorder.gpu_duration(p.op, ms);
          } else {
            (void)cudaGetLastError();
          }
        }
        recorder.completed(p.op);
        continue;  // its events go back to their pool
      }
      if (kept != i) batch[kept] = std::move(p);
      ++kept;
    }
    batch.resize(kept);
    if (!batch.empty()) {
      std::unique_lock<std::mutex> g(mu_);
      wake_.wait_for(g, kPollInterval, [this] { return stop_; });
      if (stop_) return;
    }
  }
}

}  // namespace pycoll

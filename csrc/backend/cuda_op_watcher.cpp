#include "backend/cuda_op_watcher.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/dump_watcher.h"

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

CudaOpWatcher::CudaOpWatcher(std::function<std::string()> device_error) : device_error_(std::move(device_error)) {
  pending_.reserve(1024);
}

CudaOpWatcher::~CudaOpWatcher() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CudaOpWatcher::watch(const FrHandle& op, int device, cudaStream_t stream, EventPool::Event start,
                          EventPool::Event end) {
  if (!op.recorded()) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) return;
    pending_.push_back({op, device, stream, std::move(start), std::move(end)});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    wake = idle_;  // a polling thread takes it within kPollInterval: no wake-up call on the hot path
  }
  if (wake) wake_.notify_one();
}

bool CudaOpWatcher::use_device(int device) {
  if (device == device_) return true;
  if (cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  device_ = device;
  // This thread's queries must not invalidate a CUDA graph that another thread captures in
  // the global mode (torch.cuda.graph's default), as ProcessGroupNCCL's watchdog does.
  cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&relaxed);
  return true;
}

void CudaOpWatcher::query_streams(const std::vector<Pending>& batch) {
  seen_.assign(batch.size(), Seen::Nothing);
  streams_.clear();
  for (const Pending& p : batch) {
    const StreamKey key{p.device, p.stream};
    if (std::find(streams_.begin(), streams_.end(), key) == streams_.end()) streams_.push_back(key);
  }
  for (const StreamKey& key : streams_) {
    of_stream_.clear();
    for (size_t i = 0; i < batch.size(); ++i)
      if (StreamKey{batch[i].device, batch[i].stream} == key) of_stream_.push_back(i);
    if (!use_device(key.device)) {  // the context is going away: nothing more to learn about its ops
      for (size_t i : of_stream_) seen_[i] = Seen::Gone;
      continue;
    }
    // The first op whose end has not fired; the newest op first, as a stream is most often drained.
    size_t lo = 0, hi = of_stream_.size();
    if (fired(batch[of_stream_[hi - 1]].end)) {
      lo = hi;
    } else {
      --hi;
      while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (fired(batch[of_stream_[mid]].end)) lo = mid + 1; else hi = mid;
      }
    }
    for (size_t k = 0; k < lo; ++k) seen_[of_stream_[k]] = Seen::Ended;
    if (lo < of_stream_.size()) {
      const Pending& first = batch[of_stream_[lo]];
      if (first.started || fired(first.start)) seen_[of_stream_[lo]] = Seen::Started;
    }
  }
}

void CudaOpWatcher::sweep(std::vector<Pending>& batch) {
  if (batch.empty()) return;
  FlightRecorder& recorder = FlightRecorder::get();
  query_streams(batch);
  size_t kept = 0;
  for (size_t i = 0; i < batch.size(); ++i) {  // in issue order, so that the entries change in order
    Pending& p = batch[i];
    if (seen_[i] == Seen::Gone) continue;
    if (seen_[i] != Seen::Nothing && !p.started) {
      p.started = true;
      recorder.started(p.op, /*by_this_thread=*/false);
    }
    if (seen_[i] == Seen::Ended) {
      if (timing()) {
        float ms = 0;
        if (use_device(p.device) && cudaEventElapsedTime(&ms, p.start.get(), p.end.get()) == cudaSuccess) {
          recorder.gpu_duration(p.op, ms);
        } else {
          (void)cudaGetLastError();
        }
      }
      // A kernel whose wait failed returns at once, so its end fires: the engine's error says so.
      // (An op that ended well within the poll interval before the error is marked too.)
      const std::string error = device_error_ ? device_error_() : std::string();
      if (error.empty()) {
        recorder.completed(p.op);
      } else {
        recorder.completed(p.op, error.c_str());
        DumpWatcher::get().op_failed(p.op.pg_id, error);
      }
      continue;  // its events go back to their pool
    }
    if (kept != i) batch[kept] = std::move(p);
    ++kept;
  }
  batch.resize(kept);
}

void CudaOpWatcher::loop() {
  std::vector<Pending> batch;  // taken out of pending_ while the events are queried
  batch.reserve(1024);
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock<std::mutex> g(mu_);
      if (batch.empty() && !stop_) {
        idle_ = true;
        wake_.wait(g, [this] { return stop_ || !pending_.empty(); });
        idle_ = false;
      }
      for (auto& p : pending_) batch.push_back(std::move(p));
      pending_.clear();
      stopping = stop_;
    }
    // When stopping, one last look: ops that ended within the last poll interval are recorded
    // as such, not left looking hung.
    sweep(batch);
    if (stopping) return;
    if (!batch.empty()) {
      std::unique_lock<std::mutex> g(mu_);
      wake_.wait_for(g, kPollInterval, [this] { return stop_; });
    }
  }
}

}  // namespace pycoll

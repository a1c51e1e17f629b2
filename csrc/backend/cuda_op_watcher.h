// The flight recorder's view of ops on CUDA streams: a background thread per group turns each
// op's two events into its recorded states, without synchronizing any stream (as torch's NCCL
// watchdog discovers its work's events). An op is started when the event recorded just before
// its kernels has fired and completed when the one after them has; the recorded times are when
// this thread saw that, within kPollInterval. An op that ends while the engine reports a device
// error (a peer's wait expired, a mismatch, an abort) is completed with that error, and the group's
// dump-on-error follows. With PYCOLL_FR_GPU_TIMING=1 (or, unset, TORCH_NCCL_ENABLE_TIMING=1) the
// events are timed and the entry also gets the GPU's time between them (a dump's duration_ms).
// Built only with CUDA (setup.py).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda_event_pool.h"
#include "backend/flight_recorder.h"

namespace pycoll {

class CudaOpWatcher {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{1};

  // `device_error`: the engine's device error message, empty while there is none (cheap: it is
  // called once per op that completes).
  explicit CudaOpWatcher(std::function<std::string()> device_error);
  ~CudaOpWatcher();  // one last look at the pending ops, then the thread stops
  CudaOpWatcher(const CudaOpWatcher&) = delete;
  CudaOpWatcher& operator=(const CudaOpWatcher&) = delete;

  // Whether the events of watched ops should be timed (PYCOLL_FR_GPU_TIMING).
  static bool timing();
  // Watches an op whose `start` and `end` events (of `device`) are recorded on `stream` around
  // its kernels (events of a timed pool when timing()). No-op when the op is not recorded.
  void watch(const FrHandle& op, int device, cudaStream_t stream, EventPool::Event start, EventPool::Event end);

 private:
  struct Pending {
    FrHandle op;
    int device = 0;
    cudaStream_t stream = nullptr;
    EventPool::Event start, end;
    bool started = false;
  };
  struct StreamKey {
    int device;
    cudaStream_t stream;
    bool operator==(const StreamKey& o) const { return device == o.device && stream == o.stream; }
  };
  // Whether this thread could make `device` current (false: its context is going away).
  bool use_device(int device);
  // The streams of `batch` on which every op has ended: a stream's events fire in the order they
  // were recorded, so one query of its newest op's end event answers for all its ops (the
  // queries take driver locks that the issuing thread needs too: one per stream, not two per op).
  void find_drained_streams(const std::vector<Pending>& batch);
  // Queries `batch` once; records the ops that started or ended; keeps those not completed.
  void sweep(std::vector<Pending>& batch);
  void loop();

  std::function<std::string()> device_error_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Pending> pending_;  // in issue order; reserved, so that watch() rarely allocates
  std::vector<StreamKey> seen_, drained_;  // the thread's, per sweep
  bool stop_ = false;
  bool idle_ = false;   // the thread waits for work (not polling): a new op must wake it
  int device_ = -1;     // the thread's current device: never a context on a GPU the group does not use
  std::thread thread_;  // started by the first watch()
};

}  // namespace pycoll

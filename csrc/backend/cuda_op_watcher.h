// The flight recorder's view of ops on CUDA streams: a background thread per group turns each
// op's two events into its recorded states, without synchronizing any stream (as torch's NCCL
// watchdog discovers its work's events). An op is watched on the stream its kernels run on: it
// ended when its end event (recorded there after them) fired; it started when its start event
// fired and the ops watched before it on that stream ended. The start event is one recorded just
// before its kernels on that stream, or, for an op on a comm stream, the event of the caller's
// stream that the comm stream waits for. The recorded times are when this thread saw that,
// within kPollInterval. An op that ends while the engine reports a device error (a peer's wait
// expired, a mismatch, an abort) is completed with that error, and the group's dump-on-error
// follows. With PYCOLL_FR_GPU_TIMING=1 (or, unset, TORCH_NCCL_ENABLE_TIMING=1) the events are
// timed, both on the op's stream, and the entry also gets the GPU's time between them (a dump's
// duration_ms). Built only with CUDA (setup.py).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
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
  // Watches an op whose kernels run on `stream` (of `device`), between `start` (see above) and
  // `end` (recorded on `stream`); both of a timed pool, on `stream`, when timing(). No-op when the
  // op is not recorded.
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
  enum class Seen : uint8_t { Nothing, Started, Ended, Gone };  // Gone: its context is going away
  // Whether this thread could make `device` current (false: its context is going away).
  bool use_device(int device);
  // What the events of `batch` say, into seen_ (one per op). The events of one stream fire in the
  // order they were recorded, and its ops are watched in that order (a collective is watched
  // under the issue lock), so the ops that ended are a prefix of the stream's ops: a binary search
  // of their end events finds it, and only the first op after it can have started. The queries
  // take driver locks that the issuing thread needs too: about log2(n) + 1 per stream, not 2n.
  void query_streams(const std::vector<Pending>& batch);
  // Queries `batch` once; records the ops that started or ended; keeps those not completed.
  void sweep(std::vector<Pending>& batch);
  void loop();

  std::function<std::string()> device_error_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Pending> pending_;  // in issue order; reserved, so that watch() rarely allocates
  std::vector<StreamKey> streams_;  // the thread's, per sweep
  std::vector<size_t> of_stream_;   // indices into the batch of one stream's ops
  std::vector<Seen> seen_;          // per op of the batch
  bool stop_ = false;
  bool idle_ = false;   // the thread waits for work (not polling): a new op must wake it
  int device_ = -1;     // the thread's current device: never a context on a GPU the group does not use
  std::thread thread_;  // started by the first watch()
};

}  // namespace pycoll

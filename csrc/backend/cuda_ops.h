// The CUDA side of ProcessGroupPycoll, with ProcessGroupNCCL's stream
// semantics: each device has an internal communication stream that first
// waits on the caller's current stream; the engine's kernels run there;
// every tensor is recorded on that stream for the caching allocator; the
// Work's wait() makes the caller's current stream wait on the op's end event
// without blocking the host; the Future is completed on the comm stream with
// the device list, so DDP comm-hook callbacks synchronise correctly.
// Built only when the extension has CUDA (PYCOLL_WITH_CUDA).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda_op_watcher.h"
#include "backend/device_queue.h"
#include "common/types.h"

namespace pycoll {

class CudaEngine;
class CudaTensorEngine;
class EventPool;

class CudaOps : public DeviceQueue {
 public:
  CudaOps(c10::intrusive_ptr<c10d::Store> store, std::string group_name, int rank, int size,
          std::chrono::milliseconds timeout);
  ~CudaOps() override;

  // The engine when it serves this device (every peer on this host, on a GPU with peer access
  // or, with PYCOLL_CUDA_SAME_DEVICE=kernels or events, on this GPU; with auto, every rank on this
  // GPU), else nullptr (the backend stages). Creating the engine is collective: the first CUDA op of the group does it on
  // every rank, in the same order.
  Engine* engine(const at::Device& device) override;
  bool point_to_point_on_device(const at::Device& device) override;
  std::function<void()> after_collectives(const at::Device& device) override;
  std::vector<int64_t> trace() override;
  void abort() noexcept override;

  // Collectives share one stream per device; sends and receives get one
  // each, so a send never waits behind a receive that depends on it.
  // Async (or point-to-point): orders the comm stream after the caller's
  // stream, runs body there, records tensors, and returns the Work (see
  // above). A synchronous collective (torch passes asyncOp=false) runs body
  // on the caller's current stream instead. `outputs` is what the Future holds.
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* op, uint64_t seq,
                                        const std::vector<at::Tensor>& tensors, const std::vector<at::Tensor>& outputs,
                                        bool async_op, const Body& body, Lane lane, const FrHandle& fr) override;
  c10::intrusive_ptr<c10d::Work> send(const at::Tensor& t, int dst, uint64_t seq, const FrHandle& fr) override;
  c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& t, int src, uint64_t seq, const FrHandle& fr) override;
  std::vector<c10::intrusive_ptr<c10d::Work>> p2p_batch(const std::vector<P2PRequest>& ops, uint64_t seq) override;

 private:
  CudaEngine& cuda_engine(const at::Device& device);
  c10::cuda::CUDAStream comm_stream(const at::Device& device, Lane lane);
  EventPool& events(const at::Device& device);
  // The events around a recorded op's kernels: timed when the watcher times ops.
  EventPool& watch_events(const at::Device& device);

  c10::intrusive_ptr<c10d::Store> store_;
  std::string group_name_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<CudaEngine>> engines_;
  std::unique_ptr<CudaTensorEngine> tensor_engine_;  // on the one engine, when its peers are reachable
  // The one engine a rank has (engines_ never holds two): read without the lock on every call.
  std::atomic<CudaEngine*> bound_engine_{nullptr};
  std::atomic<Engine*> bound_tensor_engine_{nullptr};
  std::atomic<int> bound_device_{-1};
  std::map<std::pair<int, int>, c10::cuda::CUDAStream> streams_;
  std::map<int, std::unique_ptr<EventPool>> event_pools_;
  std::map<int, std::unique_ptr<EventPool>> timed_event_pools_;
  // Collectives are issued one at a time; the stream of the last one (torch's streams come from
  // pools that live as long as the process, so the handle stays valid).
  std::mutex issue_mu_;
  cudaStream_t last_collective_stream_ = nullptr;
  // The flight recorder asks for traced kernels' phases at every dump (PYCOLL_CUDA_TRACE).
  void add_phases(FlightRecorder::Phases& out) const;
  int phase_source_ = -1;
  // Last member: its thread stops (joined) before the pools and streams above go away.
  CudaOpWatcher watcher_;

  // Makes `stream` wait for the last collective when that ran on another stream.
  void order_after_last_collective(cudaStream_t stream, const at::Device& device, const char* op);
  // Makes `later` wait for what is queued on `earlier` now (not while either is being captured:
  // see order_after_last_collective).
  void order_streams(cudaStream_t earlier, cudaStream_t later, const at::Device& device, const char* op);
};

}  // namespace pycoll

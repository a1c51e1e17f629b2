// The CUDA engine: collectives and point-to-point between the GPUs of one host, through a
// symmetric CUDA IPC workspace (transport/cuda_ipc) and the kernels of csrc/kernels.
//
// Contract with the backend
//   - Every rank of the group constructs the engine, in the same order, on first CUDA use
//     (collective: it exchanges IPC handles through the Store).
//   - Collectives (all_reduce ... barrier) are issued in the same order on every rank and run in
//     that order: enqueue them on one stream per engine (the backend's communication stream).
//     They share the workspace; two collectives of one engine must never run concurrently.
//   - send/recv use their own channels and may run on other streams, concurrently with
//     collectives. All sends to one peer must be ordered on one stream, likewise all receives from
//     one peer; sends and receives must be on different streams (a send larger than 1 MiB needs the
//     peer's matching receive to run).
//   - A coalesced batch (p2p_batch) runs sends and receives in one kernel on one stream: each
//     message on CTAs of its own, cut as when it is alone.
//   - Every call enqueues on `stream` and returns without blocking the host. The caller keeps the
//     tensors alive until the work completes (recordStream) and sets nothing: the engine guards
//     the device itself.
//   - After a kernel's bounded wait expires, device_error() turns non-zero for good: the backend
//     should raise device_error_message() and stop using the engine.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/rendezvous.h"
#include "common/types.h"
#include "cuda/engine_limits.h"
#include "cuda/select.h"

namespace pycoll {

namespace cuda_ipc {
class IpcWorkspace;
struct DeviceHandle;
}  // namespace cuda_ipc
namespace kernels {
struct P2PArgs;
}
class SameDevicePath;
class ScheduleKernels;
struct ScheduleCall;
struct ScheduleGeometry;
struct ScheduleProgram;

class CudaEngine {
 public:
  // Collective: every rank of the group constructs it, in the same order, on first CUDA use.
  // rv.prefix is unique per group and engine (the IPC handles are exchanged under it).
  CudaEngine(Rendezvous rv, int rank, int size, int device, std::chrono::milliseconds timeout);
  ~CudaEngine();
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  // False if some peer is on another host, lacks P2P access, or shares this rank's GPU while
  // PYCOLL_CUDA_SAME_DEVICE=staged (the backend then stages through host memory).
  bool peers_reachable() const;
  // True when the engine runs any of the group's ops: its peers are reachable and, where ranks
  // share a GPU under PYCOLL_CUDA_SAME_DEVICE=auto, every rank is on this GPU (the events path).
  bool serves_group() const;
  // PYCOLL_CUDA_SAME_DEVICE=auto with ranks sharing a GPU: no kernel of this engine runs, only the
  // events path's all_reduce, reduce_scatter, all_gather and broadcast of at least
  // events_from_bytes() (the op's output); the backend stages everything else.
  bool kernels_off() const { return kernels_off_; }
  // This rank failed an op before launching it (a schedule program it could not load). Where some
  // peer launched it (the ranks count their failures in the Store), the peers are stopped now, not
  // at the timeout (their kernels end as after an error of this rank's), and every later op of
  // this rank raises, naming `why`; where every rank failed alike, nothing is stopped.
  void fail_before_launch(const std::string& why, cudaStream_t stream);
  int64_t events_from_bytes() const { return events_from_bytes_; }

  // Every call enqueues on `stream` (whose device is `device`) and returns without blocking the
  // host. Buffers are device memory on `device`, dense, with the same counts and dtype on every
  // rank (the caller checked them: the engine checks only what the kernels need). Returns the
  // algorithm used (for logging). `t` is the dtype the kernels reduce (engines/dtypes.h); `op` one
  // of Sum, Avg, Product, Min, Max, BAnd, BOr, BXor (the backend turns PremulSum into a pre-scale +
  // Sum). Bool: Sum/Max = OR, Product/Min = AND. Any count >= 0 works (chunked through the bounded
  // workspace). `plan_text`, where given, gets the plan's description (all_reduce_plan.h).
  Algo all_reduce(const void* in, void* out, int64_t count, DType t, ReduceKind op, Algo algo, cudaStream_t stream,
                  std::string* plan_text = nullptr);  // in may be out
  // For reduce_scatter and all_gather, OneShot names the direct algorithm (one hop: every rank
  // writes every peer) and Ring the ring; TwoShot and Tree requests run the direct one.
  // reduce_scatter: `in` holds size * m elements, `out` m.
  Algo reduce_scatter(const void* in, void* out, int64_t m, DType t, ReduceKind op, Algo algo, cudaStream_t stream);
  // all_gather: `in` holds `bytes`, `out` size * bytes (any dtype: copies only).
  Algo all_gather(const void* in, void* out, int64_t bytes, Algo algo, cudaStream_t stream);
  void broadcast(void* buf, int64_t bytes, int root, cudaStream_t stream);
  // `out` is written on the root only (null elsewhere).
  void reduce(const void* in, void* out, int64_t count, DType t, ReduceKind op, int root, cudaStream_t stream);
  // Byte counts and offsets per peer, into `in` (in_bytes) and `out` (out_bytes).
  void all_to_all(const void* in, int64_t in_bytes, void* out, int64_t out_bytes,
                  const std::vector<int64_t>& send_bytes, const std::vector<int64_t>& send_offsets,
                  const std::vector<int64_t>& recv_bytes, const std::vector<int64_t>& recv_offsets,
                  cudaStream_t stream);
  // Point-to-point, matched in issue order per (src,dst) pair. Sends and receives may be issued on different
  // streams by the backend; a send must not deadlock against a send in the opposite direction (use a per-pair
  // channel of bounded size in the receiver-visible workspace with ready/consumed counters).
  void send(const void* buf, int64_t bytes, int peer, cudaStream_t stream);
  void recv(void* buf, int64_t bytes, int peer, cudaStream_t stream);
  // A coalesced batch of sends and receives (in posting order) in one launch on `stream`, by the
  // plan plan_p2p_batch made for these items. Only when that plan `fits`; otherwise the batch
  // must run as separate sends and receives. The stream must be ordered after earlier sends and
  // receives of the kinds in the batch, and later ones after it (the backend does this).
  struct P2POp {
    void* buf;  // dense; a receive's destination
    int64_t bytes;
    int peer;
    bool is_send;
  };
  gpu::P2PBatchPlan plan_p2p_batch(const std::vector<gpu::P2PBatchItem>& items) const;
  void p2p_batch(const std::vector<P2POp>& ops, const gpu::P2PBatchPlan& plan, cudaStream_t stream);
  void barrier(cudaStream_t stream);
  // A schedule program (cpu/schedule_program.h) in one kernel that runs its lanes
  // (cuda/schedule_kernel.h), and the geometry of a call of `block` elements of `elem` bytes.
  // Both throw std::invalid_argument, naming the program and the limit, for a program this engine
  // cannot run (too many lanes, a channel_depth beyond the channels' slots).
  ScheduleGeometry plan_schedule(const ScheduleProgram& p, int64_t block, int64_t elem) const;
  void run_schedule(const ScheduleCall& call, cudaStream_t stream);
  // Non-zero if a kernel's bounded spin-wait expired (peer never arrived); kernels write it into host-mapped memory.
  int device_error() const;
  std::string device_error_message() const;
  // ProcessGroup.abort(): a kernel of this engine that waits on a peer ends within a poll
  // interval, and so does every later one (cuda_ipc::IpcWorkspace::abort). Any thread.
  void abort() noexcept;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  // PYCOLL_CUDA_TRACE=1 (cuda/kernels/trace.cuh): the engine keeps the timelines of its last
  // kTraceSlots traced kernels (all_reduce, send, receive) in host-mapped memory that the kernels
  // write directly. A kernel's `rows` are cuda_ipc::kTraceCtas rows of cuda_ipc::kTraceEvents
  // %globaltimer stamps (0: not stamped); `op` is the flight-recorder record id that was this
  // thread's issuing op (common/issuing_op.h) when it was launched.
  static constexpr int kTraceSlots = 16;
  struct TracedKernel {
    uint64_t op = 0;
    uint64_t launch = 0;  // 1 for the engine's first traced launch, and so on
    std::vector<uint64_t> rows;
  };
  // The ring as it is now, oldest first, without synchronizing anything: a kernel still running
  // shows the stamps it has written so far. (A slot is reused kTraceSlots launches later, even
  // when its kernel has not run yet.)
  std::vector<TracedKernel> traced_kernels() const;
  // wall-clock ns (system_clock) minus %globaltimer ns, measured when the engine started tracing.
  int64_t gpu_clock_offset_ns() const { return gpu_clock_offset_ns_; }
  // The rows of the newest traced kernel, after synchronizing the device (zeros without tracing).
  std::vector<int64_t> trace() const;

 private:
  void check_usable(const char* op) const;
  gpu::Geometry plan_p2p(int64_t bytes) const;  // the cut of a send/recv (both ends agree)

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;  // the group's
  gpu::EngineLimits limits_;           // the settings, resolved for this GPU and group (engine_limits.h)
  int max_blocks_;                     // = limits_.max_blocks (the ops other than all_reduce plan inline)
  int small_max_blocks_;
  int64_t chunk_bytes_ = 0;
  int sms_ = 0;         // the GPU's SM count: every CTA of a collective must be resident
  bool trace_ = false;  // PYCOLL_CUDA_TRACE: kernels record their timeline
  // Claims the next slot of the ring for a launch of `ctas` CTAs on `stream`, for this thread's
  // issuing op, and points h.trace at it; h.trace stays null without tracing or under capture.
  void begin_trace(cuda_ipc::DeviceHandle& h, int ctas, cudaStream_t stream);
  void trace_p2p(kernels::P2PArgs& a, cudaStream_t stream);  // a send or receive's timeline, when tracing
  void start_tracing();                                      // allocates the ring and measures gpu_clock_offset_ns_
  uint64_t* trace_ring_ = nullptr;                           // kTraceSlots x kTraceCtas x kTraceEvents, host-mapped
  uint64_t* trace_ring_dev_ = nullptr;
  std::vector<uint64_t> trace_ops_, trace_launches_;  // per slot
  uint64_t traced_ = 0;                               // traced launches so far
  int64_t gpu_clock_offset_ns_ = 0;
  mutable std::mutex trace_mu_;
  // The registered protocols' launchers by protocol index (all_reduce_registry.h), looked up once
  // here rather than by name on every launch; null for a protocol off on this engine.
  std::vector<const gpu::AllReduceLauncher*> launchers_;
  bool early_launch_ = false;  // PYCOLL_CUDA_EARLY_LAUNCH: programmatic dependent launch (sm_90+)
  std::unique_ptr<cuda_ipc::IpcWorkspace> ws_;
  // PYCOLL_CUDA_SAME_DEVICE=events or auto with every rank on this GPU: all_reduce, reduce_scatter,
  // all_gather and broadcast go there (cuda/same_device_path.h); null otherwise.
  std::unique_ptr<SameDevicePath> same_device_;
  bool kernels_off_ = false;
  int64_t events_from_bytes_ = 0;
  int64_t events_threshold(const Rendezvous& rv, int rank);  // auto: events_from_bytes_, set or measured
  // Set once this rank left its peers behind: it ran a schedule program poisoned (all_to_all
  // splits it refused) while some peer ran it healthy, which stopped at this rank's first message;
  // or it could not load a program its peers run (they were stopped). No later op of the group
  // can meet them. out_of_step_why_ is written before the flag and never after.
  std::atomic<bool> out_of_step_{false};
  std::mutex out_of_step_mu_;  // writers of out_of_step_why_
  std::string out_of_step_why_;
  Rendezvous rv_;                        // the group's Store, for the ranks to agree on a failure
  uint64_t failures_before_launch_ = 0;  // fail_before_launch calls so far (alike on ranks that agree)
  void mark_out_of_step(std::string why);
  bool poisoned_run_in_step(cudaStream_t stream);  // after a poisoned run: did every rank run it so?
  bool stream_idle_within(cudaStream_t stream, std::chrono::milliseconds wait);
  // The programs' step tables on the device and the lanes' progress words (cuda/schedule_kernel.cu);
  // made at the first schedule call.
  std::shared_ptr<ScheduleKernels> schedule_;
};

}  // namespace pycoll

#include "backend/cuda_ops.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <exception>
#include <string>

#include "backend/work.h"
#include "backend/cuda_event_pool.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "backend/op_call_helpers.h"
#include "backend/op_stats.h"
#include "backend/store_rendezvous.h"
#include "common/issuing_op.h"
#include "transport/cuda_ipc/layout.h"
#include "cuda/cuda_engine.h"
#include "engines/cuda_tensor_engine.h"

namespace pycoll {

#define PYCOLL_CHECK_CUDA(expr, op) PYCOLL_CUDA_CHECK(expr, op, ": ", #expr)

CudaOps::CudaOps(c10::intrusive_ptr<c10d::Store> store, std::string group_name, int rank, int size,
                 std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      group_name_(std::move(group_name)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      watcher_([this]() {
        const CudaEngine* e = bound_engine_.load(std::memory_order_acquire);
        return e != nullptr && e->device_error() != 0 ? e->device_error_message() : std::string();
      }) {
  phase_source_ = FlightRecorder::get().add_phase_source([this](FlightRecorder::Phases& out) { add_phases(out); });
}

// Each traced kernel's CTAs as phases of the op that launched it: the whole run (events 0 to 1),
// and between the stamps in between, in time order (cuda/kernels/trace.cuh says what each is).
void CudaOps::add_phases(FlightRecorder::Phases& out) const {
  const CudaEngine* e = bound_engine_.load(std::memory_order_acquire);
  if (e == nullptr) return;
  const int64_t offset = e->gpu_clock_offset_ns();
  const int E = cuda_ipc::kTraceEvents;
  for (const CudaEngine::TracedKernel& k : e->traced_kernels()) {
    if (k.op == 0) continue;
    std::vector<FlightRecorder::CtaPhase>& phases = out[k.op];
    for (int c = 0; c < cuda_ipc::kTraceCtas; ++c) {
      const uint64_t* row = k.rows.data() + size_t(c) * E;
      if (row[0] == 0) continue;                     // a CTA the launch did not have (or not there yet)
      std::vector<std::pair<uint64_t, int>> stamps;  // (time, event), events 2..E-2 (E-1 is a count)
      for (int ev = 2; ev < E - 1; ++ev)
        if (row[ev] != 0) stamps.push_back({row[ev], ev});
      std::sort(stamps.begin(), stamps.end());
      // A CTA without its end stamp has not ended (still running, or stuck): said, up to its last stamp.
      const bool ended = row[1] != 0;
      const uint64_t end = ended ? row[1] : (stamps.empty() ? row[0] : stamps.back().first);
      phases.push_back({c, ended ? -1 : -2, int64_t(row[0]) + offset, int64_t(end) + offset});
      uint64_t from = row[0];
      for (const auto& [t, ev] : stamps) {
        phases.push_back({c, ev, int64_t(from) + offset, int64_t(t) + offset});
        from = t;
      }
    }
  }
}

std::unique_ptr<DeviceQueue> make_cuda_queue(c10::intrusive_ptr<c10d::Store> store, std::string group_name, int rank,
                                             int size, std::chrono::milliseconds timeout) {
  return std::make_unique<CudaOps>(std::move(store), std::move(group_name), rank, size, timeout);
}

CudaOps::~CudaOps() { FlightRecorder::get().remove_phase_source(phase_source_); }

Engine* CudaOps::engine(const at::Device& device) {
  if (Engine* e = bound_tensor_engine_.load(std::memory_order_acquire)) {
    if (bound_device_.load(std::memory_order_relaxed) == device.index()) return e;
  }
  CudaEngine& eng = cuda_engine(device);
  if (!eng.serves_group()) return nullptr;
  std::lock_guard<std::mutex> g(mu_);
  if (!tensor_engine_) {
    tensor_engine_ = std::make_unique<CudaTensorEngine>(eng);
    bound_tensor_engine_.store(tensor_engine_.get(), std::memory_order_release);
  }
  return tensor_engine_.get();
}

bool CudaOps::point_to_point_on_device(const at::Device& device) {
  return engine(device) != nullptr && !cuda_engine(device).kernels_off();
}

CudaEngine& CudaOps::cuda_engine(const at::Device& device) {
  const int idx = device.index();
  if (CudaEngine* e = bound_engine_.load(std::memory_order_acquire)) {
    if (bound_device_.load(std::memory_order_relaxed) == idx) return *e;
  }
  std::lock_guard<std::mutex> g(mu_);
  // One GPU per rank, as with NCCL: the first CUDA collective binds the group
  // to its device; a tensor elsewhere is a user error, not a second engine.
  TORCH_CHECK_VALUE(engines_.empty() || engines_.begin()->first == idx, "pycoll: wrong device: this rank's group is ",
                    "bound to cuda:", engines_.empty() ? -1 : engines_.begin()->first, " (its first CUDA collective), ",
                    "got a tensor on cuda:", idx, "; use one GPU per rank (torch.cuda.set_device(local_rank))");
  auto it = engines_.find(idx);
  if (it == engines_.end()) {
    c10::cuda::CUDAGuard guard(device);
    // Keyed by the order in which this rank first used a device, not by the
    // device index: rank r drives cuda:r, yet every rank's first engine must
    // meet the others under the same Store keys.
    const std::string key = "pycoll/" + group_name_ + "/cuda_engine" + std::to_string(engines_.size()) + "/";
    auto eng = std::make_unique<CudaEngine>(make_rendezvous(store_, key), rank_, size_, idx, timeout_);
    // The lanes' streams now, with the engine, not at the first asynchronous op: that op returned
    // only once the GPU's queued work had finished (1 s behind a 1 s kernel, on an H100); making the
    // stream pool is the likely cause.
    for (const Lane lane : {Lane::Collective, Lane::Send, Lane::Recv}) {
      streams_.emplace(std::make_pair(idx, static_cast<int>(lane)),
                       c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index()));
    }
    it = engines_.emplace(idx, std::move(eng)).first;
    bound_device_.store(idx, std::memory_order_relaxed);
    bound_engine_.store(it->second.get(), std::memory_order_release);
  }
  return *it->second;
}

std::vector<int64_t> CudaOps::trace() {
  CudaEngine* e = bound_engine_.load(std::memory_order_acquire);
  return e != nullptr ? e->trace() : std::vector<int64_t>();
}

void CudaOps::abort() noexcept {
  // Not under mu_: an engine being created holds it across a Store exchange with peers that may
  // be gone. The engines outlive this call (destroyed with the group, after abort).
  if (CudaEngine* e = bound_engine_.load(std::memory_order_acquire)) e->abort();
}

c10::cuda::CUDAStream CudaOps::comm_stream(const at::Device& device, Lane lane) {
  std::lock_guard<std::mutex> g(mu_);
  const auto key = std::make_pair(static_cast<int>(device.index()), static_cast<int>(lane));
  auto it = streams_.find(key);
  if (it == streams_.end()) {
    it = streams_.emplace(key, c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())).first;
  }
  return it->second;
}

EventPool& CudaOps::events(const at::Device& device) {
  std::lock_guard<std::mutex> g(mu_);
  auto& pool = event_pools_[device.index()];
  if (!pool) pool = std::make_unique<EventPool>(device.index());
  return *pool;
}

EventPool& CudaOps::watch_events(const at::Device& device) {
  if (!CudaOpWatcher::timing()) return events(device);
  std::lock_guard<std::mutex> g(mu_);
  auto& pool = timed_event_pools_[device.index()];
  if (!pool) pool = std::make_unique<EventPool>(device.index(), /*timed=*/true);
  return *pool;
}

std::function<void()> CudaOps::after_collectives(const at::Device& device) {
  std::lock_guard<std::mutex> issue(issue_mu_);
  if (last_collective_stream_ == nullptr) return {};
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  PYCOLL_CHECK_CUDA(cudaStreamIsCapturing(last_collective_stream_, &capture), "pycoll: staged op");
  if (capture != cudaStreamCaptureStatusNone) return {};  // nothing has run: replays are the caller's to order
  EventPool::Event e = events(device).get();
  PYCOLL_CHECK_CUDA(cudaEventRecord(e.get(), last_collective_stream_), "pycoll: staged op");
  return [e, index = device.index()] {
    c10::cuda::CUDAGuard guard(index);
    PYCOLL_CUDA_CHECK(cudaEventSynchronize(e.get()), "pycoll: a staged op waiting for the group's earlier CUDA ",
                      "collectives");
  };
}

void CudaOps::order_after_last_collective(cudaStream_t stream, const at::Device& device, const char* op) {
  if (last_collective_stream_ != nullptr && last_collective_stream_ != stream) {
    // Inside a CUDA graph capture a wait on an uncaptured stream is illegal; torch.cuda.graph
    // synchronises the device before capture, and replays are the caller's to order (as NCCL).
    cudaStreamCaptureStatus now = cudaStreamCaptureStatusNone, before = cudaStreamCaptureStatusNone;
    PYCOLL_CHECK_CUDA(cudaStreamIsCapturing(stream, &now), op);
    PYCOLL_CHECK_CUDA(cudaStreamIsCapturing(last_collective_stream_, &before), op);
    if (now == cudaStreamCaptureStatusNone && before == cudaStreamCaptureStatusNone) {
      // The wait takes the event's state at this call, so the event may go back to the pool now.
      // Recorded now, it also covers what was queued on that stream after the last collective:
      // more order than needed, never less, and only when the stream changes.
      EventPool::Event e = events(device).get();
      PYCOLL_CHECK_CUDA(cudaEventRecord(e.get(), last_collective_stream_), op);
      PYCOLL_CHECK_CUDA(cudaStreamWaitEvent(stream, e.get(), 0), op);
    }
  }
  last_collective_stream_ = stream;
}

void CudaOps::order_streams(cudaStream_t earlier, cudaStream_t later, const at::Device& device, const char* op) {
  cudaStreamCaptureStatus a = cudaStreamCaptureStatusNone, b = cudaStreamCaptureStatusNone;
  PYCOLL_CHECK_CUDA(cudaStreamIsCapturing(earlier, &a), op);
  PYCOLL_CHECK_CUDA(cudaStreamIsCapturing(later, &b), op);
  if (a != cudaStreamCaptureStatusNone || b != cudaStreamCaptureStatusNone) return;
  EventPool::Event e = events(device).get();
  PYCOLL_CHECK_CUDA(cudaEventRecord(e.get(), earlier), op);
  PYCOLL_CHECK_CUDA(cudaStreamWaitEvent(later, e.get(), 0), op);
}

c10::intrusive_ptr<c10d::Work> CudaOps::launch(c10d::OpType type, const char* op, uint64_t seq,
                                               const std::vector<at::Tensor>& tensors,
                                               const std::vector<at::Tensor>& outputs, bool async_op, const Body& body,
                                               Lane lane, const FrHandle& fr) {
  TORCH_INTERNAL_ASSERT(!tensors.empty());
  const at::Device device = tensors[0].device();
  c10::cuda::CUDAGuard guard(device);
  CudaEngine& eng = cuda_engine(device);
  if (int code = eng.device_error()) {
    C10_THROW_ERROR(DistBackendError, str(op, ": the group is unusable after a GPU-side error (code ", code,
                                          "): ", eng.device_error_message()));
  }
  auto current = c10::cuda::getCurrentCUDAStream(device.index());
  const std::vector<c10::Device> devices{device};

  // Collective kernels share the engine's channels, so they must run one after another in issue
  // order, whatever stream each is issued on (FSDP2 issues all-gathers and reduce-scatters from
  // two streams). Held until the kernel is queued.
  std::unique_lock<std::mutex> issue;
  if (lane == Lane::Collective) issue = std::unique_lock<std::mutex>(issue_mu_);

  // A recorded op gets its states from events around its kernels (the watcher), except while the
  // stream is captured into a CUDA graph: nothing runs then, and such events cannot be queried.
  bool watched = fr.recorded();
  if (watched) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    PYCOLL_CHECK_CUDA(cudaStreamIsCapturing(current.stream(), &capture), op);
    watched = capture == cudaStreamCaptureStatusNone;
    if (!watched) FlightRecorder::get().started(fr);
  }
  const auto event_on = [&](cudaStream_t s) {
    EventPool::Event e = watch_events(device).get();
    PYCOLL_CHECK_CUDA(cudaEventRecord(e.get(), s), op);
    return e;
  };
  // An op whose body raises (nothing of it was queued, or part) is completed with that error.
  const auto run_body = [&](const c10::Stream& s) {
    try {
      body(s);
    } catch (const std::exception& e) {
      std::string why = e.what();
      if (const auto nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
      FlightRecorder::get().completed(fr, why.c_str());
      throw;
    }
  };

  if (!async_op && lane == Lane::Collective) {
    // A synchronous collective runs on the caller's stream, as ProcessGroupNCCL
    // does for asyncOp=false: the caller waits for it anyway, so the comm
    // stream would only add two events and a cross-stream hop (several us of
    // a ~15 us small all_reduce). The tensors are used only on the caller's
    // stream, so the allocator needs no recordStream.
    order_after_last_collective(current.stream(), device, op);
    EventPool::Event before = watched ? event_on(current.stream()) : nullptr;
    run_body(current);
    if (watched) watcher_.watch(fr, device.index(), current.stream(), std::move(before), event_on(current.stream()));
    auto work = c10::make_intrusive<PycollWork>(rank_, type, op, seq, outputs, devices, /*lazy_future=*/true);
    const cudaStream_t s = current.stream();
    // Conservative: the stream is idle only once this op (and what followed) ran.
    work->query = [s]() {
      const cudaError_t err = cudaStreamQuery(s);
      if (err == cudaErrorNotReady) (void)cudaGetLastError();
      return err == cudaSuccess;
    };
    work->mark_done(nullptr);
    work->settle_future();
    return work;
  }

  auto comm = comm_stream(device, lane);
  EventPool& pool = events(device);
  EventPool::Event start = pool.get();
  PYCOLL_CHECK_CUDA(cudaEventRecord(start.get(), current.stream()), op);
  PYCOLL_CHECK_CUDA(cudaStreamWaitEvent(comm.stream(), start.get(), 0), op);
  if (lane == Lane::Collective) order_after_last_collective(comm.stream(), device, op);
  for (const auto& t : tensors) {
    if (t.defined() && t.numel() > 0) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), comm);
  }
  // Untimed, the op's own events serve the watcher: the one its comm stream waits for (the op
  // starts once it fired and the ops before it on the comm stream ended: the watcher knows those)
  // and the Work's end. Timed, a duration needs timed events around the kernels on one stream.
  const bool timed = watched && CudaOpWatcher::timing();
  EventPool::Event before = timed ? event_on(comm.stream()) : nullptr;
  {
    c10::cuda::CUDAStreamGuard sg(comm);  // temporaries made by body live on the comm stream
    run_body(comm);
  }
  EventPool::Event end = pool.get();
  PYCOLL_CHECK_CUDA(cudaEventRecord(end.get(), comm.stream()), op);
  if (timed) {
    watcher_.watch(fr, device.index(), comm.stream(), std::move(before), event_on(comm.stream()));
  } else if (watched) {
    watcher_.watch(fr, device.index(), comm.stream(), start, end);
  }

  auto work = c10::make_intrusive<PycollWork>(rank_, type, op, seq, outputs, devices);
  work->on_wait = [end, device]() {
    // Blocks the caller's stream, not the host (ProcessGroupNCCL's wait()).
    PYCOLL_CUDA_CHECK(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device.index()).stream(), end.get(), 0),
                      "pycoll: cudaStreamWaitEvent");
  };
  work->query = [end]() {
    const cudaError_t err = cudaEventQuery(end.get());
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();  // a not-ready query is not an error to report later
      return false;
    }
    PYCOLL_CUDA_CHECK(err, "pycoll: cudaEventQuery");
    return true;
  };
  work->mark_done(nullptr);
  {
    c10::cuda::CUDAStreamGuard sg(comm);  // the Future's events go on the comm stream
    work->settle_future();
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> CudaOps::send(const at::Tensor& t, int dst, uint64_t seq, const FrHandle& fr) {
  static constexpr const char* kOp = "pycoll::send";
  return launch(
      c10d::OpType::SEND, kOp, seq, {t}, {t}, /*async_op=*/true,
      [this, t, dst, fr](const c10::Stream& s) {
        const IssuingOp issuing(fr.record_id);  // a traced kernel's timeline names its op
        const at::Tensor buf = dense(t);        // alive until the kernel is queued (on this stream)
        cuda_engine(t.device()).send(buf.data_ptr(), int64_t(buf.nbytes()), dst, c10::cuda::CUDAStream(s).stream());
        record_op("send", static_cast<int64_t>(t.nbytes()), Algo::Direct, OpTimer(), -1, size_);
      },
      Lane::Send, fr);
}

c10::intrusive_ptr<c10d::Work> CudaOps::recv(const at::Tensor& t, int src, uint64_t seq, const FrHandle& fr) {
  static constexpr const char* kOp = "pycoll::recv";
  return launch(
      c10d::OpType::RECV, kOp, seq, {t}, {t}, /*async_op=*/true,
      [this, t, src, fr](const c10::Stream& s) {
        const IssuingOp issuing(fr.record_id);
        at::Tensor buf = dense(t);
        cuda_engine(t.device()).recv(buf.data_ptr(), int64_t(buf.nbytes()), src, c10::cuda::CUDAStream(s).stream());
        write_back(t, buf);
      },
      Lane::Recv, fr);
}

std::vector<c10::intrusive_ptr<c10d::Work>> CudaOps::p2p_batch(const std::vector<P2PRequest>& ops, uint64_t seq) {
  static constexpr const char* kOp = "pycoll::batch_isend_irecv";
  TORCH_INTERNAL_ASSERT(!ops.empty());
  const at::Device device = ops[0].t.device();
  std::vector<gpu::P2PBatchItem> items;
  std::vector<at::Tensor> tensors, received;
  bool has_send = false, has_recv = false;
  for (const P2PRequest& o : ops) {
    TORCH_CHECK_VALUE(o.t.device() == device, "pycoll::batch_isend_irecv: every tensor must be on one device; got ",
                      device.str(), " and ", o.t.device().str());
    items.push_back({o.peer, o.is_send, int64_t(o.t.nbytes())});
    tensors.push_back(o.t);
    if (o.is_send) {
      has_send = true;
    } else {
      has_recv = true;
      received.push_back(o.t);
    }
  }
  c10::cuda::CUDAGuard guard(device);
  CudaEngine& eng = cuda_engine(device);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  const gpu::P2PBatchPlan plan = eng.plan_p2p_batch(items);
  if (!plan.fits) {
    // Each on its lane, as when posted one by one (the peer may post them so: it agrees on every chunk).
    for (const P2PRequest& o : ops)
      works.push_back(o.is_send ? send(o.t, o.peer, o.seq, FrHandle()) : recv(o.t, o.peer, o.seq, FrHandle()));
    return works;
  }
  // One kernel, on the lane of its kind (a batch of receives never waits behind a send). Sends
  // and receives each keep one order per lane (their channels' counters): a batch of both runs on
  // the send lane after the receive lane's earlier ops, and the receive lane's later ops wait for it.
  const Lane lane = has_send ? Lane::Send : Lane::Recv;
  const bool both = has_send && has_recv;
  const cudaStream_t send_lane = comm_stream(device, Lane::Send).stream();
  const cudaStream_t recv_lane = comm_stream(device, Lane::Recv).stream();
  if (both) order_streams(recv_lane, send_lane, device, kOp);
  int64_t bytes = 0;
  for (const auto& it : items) bytes += it.bytes;
  works.push_back(launch(
      c10d::OpType::COALESCED, kOp, seq, tensors, received, /*async_op=*/true,
      [&](const c10::Stream& s) {
        std::vector<CudaEngine::P2POp> eops;
        std::vector<at::Tensor> bufs;  // alive until the kernel is queued (on this stream)
        std::vector<std::pair<at::Tensor, at::Tensor>> copies_back;
        eops.reserve(ops.size());
        bufs.reserve(ops.size());
        for (const P2PRequest& o : ops) {
          bufs.push_back(dense(o.t));
          const at::Tensor& buf = bufs.back();
          if (!o.is_send && !buf.is_same(o.t)) copies_back.emplace_back(o.t, buf);
          eops.push_back({buf.data_ptr(), int64_t(buf.nbytes()), o.peer, o.is_send});
        }
        eng.p2p_batch(eops, plan, c10::cuda::CUDAStream(s).stream());
        for (const auto& [user, buf] : copies_back) write_back(user, buf);
        record_op("batch_isend_irecv", bytes, Algo::Direct, OpTimer(), -1, size_);
      },
      lane, FrHandle()));
  if (both) order_streams(send_lane, recv_lane, device, kOp);
  return works;
}

}  // namespace pycoll

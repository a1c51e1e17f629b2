// Host side of the CUDA engine: argument checks, dtype/op mapping, launch planning (all_reduce:
// all_reduce_plan.h; the others through select.h), kernel launches (through launch.h). Nothing here blocks the host or allocates.
#include "cuda/cuda_engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include "common/cuda_check.h"
#include "common/issuing_op.h"
#include "common/settings_agreement.h"
#include "cuda/all_reduce_plan.h"
#include "cuda/all_reduce_registry.h"
#include "cuda/kernel_type.h"
#include "cuda/cuda_settings.h"
#include "cuda/launch.h"
#include "engines/dtypes.h"
#include "cuda/measured_choices.h"
#include "cuda/same_device_path.h"
#include "cuda/select.h"
#include "cuda/kernels/args.h"
#include "transport/cuda_ipc/check_word.h"
#include "transport/cuda_ipc/workspace.h"

namespace pycoll {

namespace {

using cuda_ipc::kCollBlocks;
using cuda_ipc::kMaxRanks;
using KOp = kernels::ReduceOp;
using gpu::kernel_type;
using gpu::KernelType;

#define PYCOLL_CUDA_OK(expr, op, what) PYCOLL_CUDA_CHECK(expr, "pycoll::", op, ": ", what)

void copy_local(void* dst, const void* src, int64_t bytes, cudaStream_t stream, const char* op) {
  if (bytes <= 0 || dst == src) return;
  PYCOLL_CUDA_OK(cudaMemcpyAsync(dst, src, size_t(bytes), cudaMemcpyDeviceToDevice, stream), op, "cudaMemcpyAsync");
}

// What a rank that waits in vain for its peers while the engine starts is told.
std::string engine_start_help() {
  return "The ranks of a group make its CUDA engine together, each mapping every peer's memory (across "
         "hosts, the ranks of each host, numbered within the host): with init_process_group(device_id=...), "
         "at init and at each new_group; else at the group's first CUDA op. Without device_id, a send or recv "
         "between some ranks cannot be a group's first CUDA op while its other ranks wait elsewhere: bind the "
         "device at init (init_process_group(..., device_id=torch.device(\"cuda\", local_rank))), or have every "
         "rank of the group issue a CUDA op on it first. Otherwise the ranks named crashed, hung, or did not "
         "reach init_process_group / new_group.";
}

}  // namespace

// Auto: below this size the backend stages an op of ranks sharing one GPU. The setting, or measured
// here: one small events-path op costs about two context switches between the processes without
// the MPS daemon (about 440 us on an H200 with 2 ranks, about 1 ms with 4), under which staging
// through host memory is faster up to about 1 MiB; under MPS it costs tens of us and the events
// path is the faster at every size (docs/decisions/0039-ipc-event-handoff.md). Rank 0's
// measurement decides for all: every rank must split at the same size.
int64_t CudaEngine::events_threshold(const Rendezvous& rv, int rank) {
  constexpr int kProbeOps = 8;
  constexpr double kMpsLikeUs = 100;
  constexpr int64_t kStagedBelowWithoutMps = int64_t(1) << 20;
  const int64_t kib = cuda_settings::kSameDeviceStagedBelowKiB.get();
  if (kib >= 0) return kib * 1024;
  const double us = same_device_->time_small_all_reduce_us(kProbeOps);
  const std::string key = rv.prefix + "same_device_probe_us";
  if (rank == 0) rv.set(key, std::to_string(us));
  const double decided = std::stod(rv.get(key));
  return decided > kMpsLikeUs ? kStagedBelowWithoutMps : 0;
}

CudaEngine::CudaEngine(Rendezvous rv, int rank, int size, int device, std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), device_(device), timeout_(timeout), rv_(rv) {
  TORCH_CHECK(device >= 0, "pycoll::CudaEngine: device must be a CUDA device index, got ", device);
  int sms = 0;
  PYCOLL_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "engine", "SM count");
  sms_ = sms;
  limits_ = gpu::read_engine_limits(size, sms);
  max_blocks_ = limits_.max_blocks;
  small_max_blocks_ = limits_.small_max_blocks;
  chunk_bytes_ = limits_.chunk_bytes;
  trace_ = cuda_settings::kTrace.get() != 0;
  const cuda_settings::SameDeviceMode same_device_mode = cuda_settings::same_device_mode();
  const bool same_device = same_device_mode != cuda_settings::SameDeviceMode::Staged;

  // Every rank must plan the same launches from these (the GPUs of a group are assumed alike, as
  // the workspace size check assumes): compare them before anything is launched. Tracing and early
  // launch change only what a rank's own CTAs record and when they start: not compared.
  if (size > 1) {
    const std::string measured = gpu::measured_steps_digest(size);
    SettingList mine = gpu::agreement_list(limits_);
    mine.push_back({"measured auto choices (PYCOLL_COST_MODEL)", measured.empty() ? std::string("none") : measured});
    mine.push_back({cuda_settings::kSameDevice.name(), cuda_settings::same_device_mode_name(same_device_mode)});
    mine.push_back({cuda_settings::kSameDeviceStagedBelowKiB.name(),
                    std::to_string(cuda_settings::kSameDeviceStagedBelowKiB.get())});
    rv.set(rv.prefix + "settings/" + std::to_string(rank), encode_settings(mine));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(rv.prefix + "settings/" + std::to_string(r));
    // The group's timeout, not the store's.
    rv.wait_every_rank(keys, timeout, "pycoll: the group's CUDA engine could not start", engine_start_help());
    std::vector<std::string> all;
    for (const auto& k : keys) all.push_back(rv.get(k));
    const std::string diff = settings_disagreement(all);
    TORCH_CHECK(diff.empty(), "pycoll CUDA engine: the ranks of this group were started with different settings, ",
                "so their kernels would not fit together; set them alike on every rank:\n", diff);
  }

  ws_ = std::make_unique<cuda_ipc::IpcWorkspace>(rv, rank, size, device, timeout, limits_.slot_bytes,
                                                 limits_.workspace_blocks, gpu::protocol_regions(limits_),
                                                 limits_.p2p_slot_bytes, same_device);
  TORCH_INTERNAL_ASSERT(ws_->layout().coll.slot_bytes == limits_.slot_bytes, "pycoll: workspace slot size ",
                        ws_->layout().coll.slot_bytes, " differs from the planned ", limits_.slot_bytes);
  int major = 0;
  PYCOLL_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "engine",
                 "compute capability");
  early_launch_ =
      cuda_settings::kEarlyLaunch.get_or(major >= 9 ? 1 : 0) != 0 && major >= 9 && gpu::kernels_support_early_launch();
  // A protocol that can be planned must have its kernel in this build (a launcher registered
  // under another name would otherwise fail only at its first call).
  for (size_t i = 0; i < gpu::all_reduce_protocols().size(); ++i) {
    launchers_.push_back(limits_.protocols[i].max_bytes > 0 ? gpu::all_reduce_launcher(int(i)) : nullptr);
    TORCH_CHECK(limits_.protocols[i].max_bytes == 0 || launchers_.back() != nullptr,
                "pycoll CUDA engine: the all_reduce protocol '", gpu::all_reduce_protocols()[i].name,
                "' is registered, but this build has no launcher registered under that name");
  }
  const bool auto_mode = same_device_mode == cuda_settings::SameDeviceMode::Auto;
  // Auto: ranks that share a GPU never run the kernels, which spin on each other's flags (through
  // the time slices of every process without the MPS daemon; under it, only while every rank's
  // CTAs fit at once). Only the events path runs on the device, or nothing does (the backend stages).
  kernels_off_ = auto_mode && ws_->reachable() && ws_->gpus_shared();
  // Every rank on this GPU, events or auto: the main collectives run with no cross-process spinning.
  if ((same_device_mode == cuda_settings::SameDeviceMode::Events || auto_mode) && size > 1 && ws_->reachable() &&
      ws_->peers_on_this_gpu() == size - 1) {
    same_device_ = std::make_unique<SameDevicePath>(rv, rank, size, device, timeout,
                                                    cuda_settings::kSameDeviceStagingKiB.get() * 1024);
    if (auto_mode) events_from_bytes_ = events_threshold(rv, rank);
  }
  if (trace_ && size > 1 && ws_->reachable()) start_tracing();  // last: nothing after it throws
}

namespace {

constexpr size_t kTraceRowsPerKernel = size_t(cuda_ipc::kTraceCtas) * cuda_ipc::kTraceEvents;
constexpr size_t kTraceSlotWords = size_t(cuda_ipc::kTraceSlotWords);

int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void CudaEngine::start_tracing() {
  void* ring = nullptr;
  const size_t bytes = size_t(kTraceSlots) * kTraceSlotWords * sizeof(uint64_t);
  PYCOLL_CUDA_OK(cudaHostAlloc(&ring, bytes, cudaHostAllocMapped | cudaHostAllocPortable), "engine", "trace ring");
  std::memset(ring, 0, bytes);
  trace_ring_ = static_cast<uint64_t*>(ring);
  void* dev = nullptr;
  PYCOLL_CUDA_OK(cudaHostGetDevicePointer(&dev, ring, 0), "engine", "trace ring device pointer");
  trace_ring_dev_ = static_cast<uint64_t*>(dev);
  trace_ops_.assign(kTraceSlots, 0);
  trace_launches_.assign(kTraceSlots, 0);
  // %globaltimer against the wall clock: the read with the shortest round trip of a few.
  void* clock = nullptr;
  PYCOLL_CUDA_OK(cudaHostAlloc(&clock, sizeof(uint64_t), cudaHostAllocMapped), "engine", "clock word");
  void* clock_dev = nullptr;
  cudaStream_t s = nullptr;
  PYCOLL_CUDA_OK(cudaHostGetDevicePointer(&clock_dev, clock, 0), "engine", "clock word device pointer");
  PYCOLL_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "engine", "clock stream");
  int64_t best = INT64_MAX;
  for (int i = 0; i < 5; ++i) {
    const int64_t t0 = wall_now_ns();
    PYCOLL_CUDA_OK(gpu::launch_read_globaltimer(static_cast<uint64_t*>(clock_dev), s), "engine", "clock read");
    PYCOLL_CUDA_OK(cudaStreamSynchronize(s), "engine", "clock read");
    const int64_t t1 = wall_now_ns();
    if (t1 - t0 < best) {
      best = t1 - t0;
      gpu_clock_offset_ns_ = t0 + (t1 - t0) / 2 - int64_t(*static_cast<volatile uint64_t*>(clock));
    }
  }
  (void)cudaStreamDestroy(s);
  (void)cudaFreeHost(clock);
}

void CudaEngine::begin_trace(cuda_ipc::DeviceHandle& h, int ctas, cudaStream_t stream) {
  h.trace = nullptr;
  if (trace_ring_ == nullptr) return;
  // A captured launch would stamp, at every replay, a slot that other ops have since taken.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return;
  }
  std::lock_guard<std::mutex> g(trace_mu_);
  const size_t slot = size_t(traced_ % kTraceSlots);
  ++traced_;
  trace_ops_[slot] = issuing_op();
  trace_launches_[slot] = traced_;
  uint64_t* words = trace_ring_ + slot * kTraceSlotWords;
  const size_t rows = size_t(std::clamp(ctas, 0, cuda_ipc::kTraceCtas));
  std::memset(words, 0, rows * cuda_ipc::kTraceEvents * sizeof(uint64_t));  // rows beyond: other launches'
  for (size_t c = 0; c < rows; ++c) words[cuda_ipc::trace_launch_index(int(c))] = 0;
  h.trace = trace_ring_dev_ + slot * kTraceSlotWords;
  h.trace_launch = traced_;
}

std::vector<CudaEngine::TracedKernel> CudaEngine::traced_kernels() const {
  std::vector<TracedKernel> out;
  if (trace_ring_ == nullptr) return out;
  std::lock_guard<std::mutex> g(trace_mu_);
  const uint64_t n = std::min<uint64_t>(traced_, kTraceSlots);
  for (uint64_t k = traced_ - n; k < traced_; ++k) {
    const size_t slot = size_t(k % kTraceSlots);
    TracedKernel t;
    t.op = trace_ops_[slot];
    t.launch = trace_launches_[slot];
    const volatile uint64_t* words = trace_ring_ + slot * kTraceSlotWords;
    t.rows.assign(kTraceRowsPerKernel, 0);
    for (int c = 0; c < cuda_ipc::kTraceCtas; ++c) {
      if (words[cuda_ipc::trace_launch_index(c)] != t.launch) continue;  // not started, or an older launch's
      for (int e = 0; e < cuda_ipc::kTraceEvents; ++e)
        t.rows[cuda_ipc::trace_index(c, e)] = words[cuda_ipc::trace_index(c, e)];
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<int64_t> CudaEngine::trace() const {
  std::vector<int64_t> rows(kTraceRowsPerKernel, 0);
  if (trace_ring_ == nullptr) return rows;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  PYCOLL_CUDA_OK(cudaDeviceSynchronize(), "trace", "synchronize");
  const std::vector<TracedKernel> kernels = traced_kernels();
  if (!kernels.empty()) std::copy(kernels.back().rows.begin(), kernels.back().rows.end(), rows.begin());
  return rows;
}

CudaEngine::~CudaEngine() {
  same_device_.reset();
  if (trace_ring_ != nullptr) (void)cudaFreeHost(trace_ring_);
}

bool CudaEngine::peers_reachable() const { return ws_->reachable(); }
bool CudaEngine::serves_group() const { return ws_->reachable() && (!kernels_off_ || same_device_ != nullptr); }
int CudaEngine::device_error() const { return ws_->error_code(); }
void CudaEngine::abort() noexcept {
  ws_->abort();
  if (same_device_) same_device_->abort();
}
std::string CudaEngine::device_error_message() const { return ws_->error_message(); }

void CudaEngine::check_usable(const char* op) const {
  TORCH_CHECK(ws_->reachable(), "pycoll::", op, ": the CUDA engine cannot reach every peer (",
              ws_->unreachable_reason(), "); stage through host memory instead");
  // First: this rank's own reason says more than the kernels' errors it caused by stopping them.
  TORCH_CHECK(!out_of_step_.load(std::memory_order_acquire), "pycoll::", op,
              ": the group is unusable: ", out_of_step_why_);
  TORCH_CHECK(ws_->error_code() == 0, "pycoll::", op, ": ", ws_->error_message());
  // The events path's failure ends the group for the kernels' ops too (a peer is gone or out of step).
  TORCH_CHECK(!same_device_ || same_device_->broken().empty(), "pycoll::", op, ": ", same_device_->broken());
}

void CudaEngine::mark_out_of_step(std::string why) {
  std::lock_guard<std::mutex> g(out_of_step_mu_);
  if (out_of_step_.load(std::memory_order_acquire)) return;
  out_of_step_why_ = std::move(why);
  out_of_step_.store(true, std::memory_order_release);
}

void CudaEngine::fail_before_launch(const std::string& why, cudaStream_t stream) {
  if (size_ == 1) return;
  // Did every rank fail here alike (a program that no rank can load)? Then they all raise and the
  // group goes on, as on the CPU engine. Each failing rank counts itself under this failure's
  // number in the Store; a rank that launched the program never does, so a count short of the
  // group after a quarter of the timeout (at most 15 s) means that peers wait in kernels for it.
  const auto agree_wait =
      std::clamp<std::chrono::milliseconds>(timeout_ / 4, std::chrono::seconds(1), std::chrono::seconds(15));
  bool alike = false;
  try {
    const std::string key = rv_.prefix + "failed_before_launch/" + std::to_string(++failures_before_launch_);
    rv_.add(key, 1);
    const auto deadline = std::chrono::steady_clock::now() + agree_wait;
    while (!(alike = rv_.add(key, 0) >= size_) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } catch (const std::exception&) {
    alike = false;  // no Store to agree through: assume the worst
  }
  if (alike) return;
  mark_out_of_step("this rank failed an earlier op that its peers launched (" + why + ")");
  // This rank's earlier work first (it needs the peers, still in step); then the peers' kernels
  // and this rank's own stop, now and later.
  (void)stream_idle_within(stream, std::chrono::seconds(5));
  ws_->stop_group();
  if (same_device_) same_device_->abort();  // the events path's host waits, this rank's and the peers'
}

// An error path's bounded wait: false under graph capture (nothing to wait for) or when the
// stream's work so far has not finished within `wait`.
bool CudaEngine::stream_idle_within(cudaStream_t stream, std::chrono::milliseconds wait) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return false;
  }
  cudaEvent_t done = nullptr;
  if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  bool finished = false;
  if (cudaEventRecord(done, stream) == cudaSuccess) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
      const cudaError_t e = cudaEventQuery(done);
      if (e == cudaSuccess) {
        finished = true;
        break;
      }
      if (e != cudaErrorNotReady || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  (void)cudaGetLastError();
  (void)cudaEventDestroy(done);
  return finished;
}

namespace {

kernels::ReduceArgs make_reduce_args(const cuda_ipc::DeviceHandle& h, OpCode op, const void* in, void* out,
                                     const KernelType& kt) {
  kernels::ReduceArgs a{};
  a.h = h;
  a.op = int32_t(op);
  a.in = in;
  a.out = out;
  a.div = kt.div;
  a.dtype = kt.dtype;
  a.rop = kt.op;
  a.elem_size = int32_t(dtype_size(kt.dtype));
  a.root = 0;
  for (int t = 0; t < 2; ++t) {
    a.tree_parent[t] = -1;
    a.tree_child[t][0] = a.tree_child[t][1] = -1;
  }
  return a;
}

// The plan a reduce_scatter or reduce launch runs, for the check word: from the mode, so set_check
// must follow the last change to it (all_reduce takes its check plan from its plan value).
cuda_ipc::CheckPlan plan_of(const kernels::ReduceArgs& a) {
  switch (a.mode) {
    case kernels::ReduceMode::ReduceScatterRing: return cuda_ipc::CheckPlan::Ring;
    case kernels::ReduceMode::ReduceScatterDirect:
    case kernels::ReduceMode::ReduceDirect: return cuda_ipc::CheckPlan::Direct;
    default: return cuda_ipc::CheckPlan::Unspecified;
  }
}
cuda_ipc::CheckPlan plan_of(const kernels::CopyArgs& a) {
  switch (a.mode) {
    case kernels::CopyMode::AllGatherDirect: return cuda_ipc::CheckPlan::Direct;
    case kernels::CopyMode::AllGatherRing: return cuda_ipc::CheckPlan::Ring;
    default: return cuda_ipc::CheckPlan::Unspecified;
  }
}

// `count` and `root` as every rank must have passed them, and the plan it runs (check_word.h).
void set_check(kernels::ReduceArgs& a, int64_t count, int root) {
  a.check = cuda_ipc::collective_check_word(a.op, int(a.dtype), int(a.rop), root, count, plan_of(a));
}
void set_check(kernels::CopyArgs& a, int64_t bytes, int root) {
  a.check = cuda_ipc::collective_check_word(a.op, 0, 0, root, bytes, plan_of(a));
}

void launch_reduce_checked(const gpu::Geometry& g, cudaStream_t stream, kernels::ReduceArgs& a, bool early,
                           const char* op) {
  a.chunk = g.chunk;
  a.nchunks = g.nchunks;
  TORCH_CHECK(g.blocks >= 1 && g.blocks <= a.h.layout.coll.nblocks, "pycoll::", op, ": bad launch geometry (", g.blocks,
              " CTAs)");
  PYCOLL_CUDA_OK(gpu::launch_reduce(g.blocks, stream, a, early), op, "kernel launch");
}

void launch_copy_checked(int grid, cudaStream_t stream, const kernels::CopyArgs& a, bool early, const char* op) {
  // all_to_all runs two CTAs per channel (a sender and a receiver); every other mode one.
  const bool paired = a.mode == kernels::CopyMode::AllToAll;
  const int channels = paired ? grid / 2 : grid;
  TORCH_CHECK(grid >= 1 && channels <= a.h.layout.coll.nblocks && (!paired || grid % 2 == 0), "pycoll::", op,
              ": bad launch geometry (", grid, " CTAs)");
  PYCOLL_CUDA_OK(gpu::launch_copy(grid, stream, a, early), op, "kernel launch");
}

kernels::CopyArgs make_copy_args(const cuda_ipc::DeviceHandle& h, OpCode op, kernels::CopyMode mode) {
  kernels::CopyArgs a{};
  a.h = h;
  a.op = int32_t(op);
  a.mode = mode;
  return a;
}

}  // namespace

Algo CudaEngine::all_reduce(const void* in, void* out, int64_t count, DType t, ReduceKind op, Algo algo,
                            cudaStream_t stream, std::string* plan_text) {
  const char* kOp = "allreduce";
  const KernelType kt = kernel_type(t, op, size_, kOp);
  const int64_t es = int64_t(dtype_size(kt.dtype));
  const gpu::AllReducePlan p = gpu::plan_all_reduce(count, es, algo, limits_);
  if (plan_text) *plan_text = p.describe();
  if (count == 0) return p.algo;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  if (size_ == 1) {
    copy_local(out, in, count * es, stream, kOp);
    return p.algo;
  }
  check_usable(kOp);
  if (same_device_) {  // every rank on this GPU, PYCOLL_CUDA_SAME_DEVICE=events or auto
    if (plan_text) *plan_text = "same-device events: one-shot reads of the peers' staging";
    return same_device_->all_reduce(in, out, count, t, op, stream);
  }
  // One launch path for every protocol (all_reduce_registry.h): the plan's fields, what the
  // protocol adds (prepare), the check that the launch stays inside the workspace, its launcher.
  const gpu::AllReduceProtocol& proto = gpu::all_reduce_protocols().at(size_t(p.protocol));
  const gpu::AllReduceLauncher* launcher = launchers_.at(size_t(p.protocol));  // planned: not null
  kernels::ReduceArgs a = make_reduce_args(ws_->handle(), OpCode::AllReduce, in, out, kt);
  a.count = count;
  a.check = cuda_ipc::collective_check_word(a.op, int(a.dtype), int(a.rop), 0, count, p.check);
  a.mode = p.mode;
  a.flags = p.flags | (trace_ ? kernels::kArgTrace : 0);  // kernels that stamp their timeline read it
  a.seg = p.seg;
  a.chunk = p.chunk;
  a.nchunks = p.nchunks;
  a.region = p.protocol;
  if (proto.prepare) proto.prepare(a, p);
  // Each protocol's own CTA limit: the SMs for the channel protocol (every CTA resident), the LL
  // region's 64 blocks for LL, LL128's setting.
  const int max_grid = limits_.protocols.at(size_t(p.protocol)).max_blocks;
  TORCH_CHECK(p.grid >= 1 && p.grid <= max_grid && proto.fits(p, count, es, size_, p.protocol, ws_->layout()),
              "pycoll::allreduce: the plan (", p.describe(), ") does not fit this engine's workspace or GPU");
  if (trace_) begin_trace(a.h, p.grid, stream);
  PYCOLL_CUDA_OK(static_cast<cudaError_t>(launcher->launch(p.grid, stream, a, early_launch_ && p.early_ok)), kOp,
                 "kernel launch");
  return p.algo;
}

Algo CudaEngine::reduce_scatter(const void* in, void* out, int64_t m, DType t, ReduceKind op, Algo algo,
                                cudaStream_t stream) {
  const char* kOp = "reduce_scatter";
  const KernelType kt = kernel_type(t, op, size_, kOp);
  const int64_t es = int64_t(dtype_size(kt.dtype));
  Algo chosen = algo == Algo::Auto ? gpu::choose(OpCode::ReduceScatter, m * es, size_) : algo;
  if (chosen != Algo::Ring) chosen = Algo::OneShot;
  if (m == 0) return chosen;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  if (size_ == 1) {
    copy_local(out, in, m * es, stream, kOp);
    return chosen;
  }
  check_usable(kOp);
  if (same_device_) {
    same_device_->reduce_scatter(in, out, m, t, op, stream);
    return Algo::OneShot;
  }
  kernels::ReduceArgs a = make_reduce_args(ws_->handle(), OpCode::ReduceScatter, in, out, kt);
  a.mode = chosen == Algo::Ring ? kernels::ReduceMode::ReduceScatterRing : kernels::ReduceMode::ReduceScatterDirect;
  a.count = m * size_;
  a.seg = m;
  a.out_stride = 0;
  set_check(a, m, 0);
  const gpu::Geometry g = gpu::plan_geometry(m, es, chunk_bytes_, max_blocks_, small_max_blocks_);
  launch_reduce_checked(g, stream, a, early_launch_, kOp);
  return chosen;
}

Algo CudaEngine::all_gather(const void* in, void* out, int64_t bytes, Algo algo, cudaStream_t stream) {
  const char* kOp = "allgather";
  Algo chosen = algo == Algo::Auto ? gpu::choose(OpCode::AllGather, bytes, size_) : algo;
  if (chosen != Algo::Ring) chosen = Algo::OneShot;
  if (bytes == 0) return chosen;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  if (size_ == 1) {
    copy_local(out, in, bytes, stream, kOp);
    return chosen;
  }
  check_usable(kOp);
  if (same_device_) {
    same_device_->all_gather(in, out, bytes, stream);
    return Algo::OneShot;
  }
  kernels::CopyArgs a =
      make_copy_args(ws_->handle(), OpCode::AllGather,
                     chosen == Algo::Ring ? kernels::CopyMode::AllGatherRing : kernels::CopyMode::AllGatherDirect);
  a.in = in;
  a.out = out;
  a.bytes = bytes;
  set_check(a, bytes, 0);
  const gpu::Geometry g = gpu::plan_geometry(bytes, 1, chunk_bytes_, max_blocks_, small_max_blocks_);
  a.chunk = g.chunk;
  a.nchunks = g.nchunks;
  launch_copy_checked(g.blocks, stream, a, early_launch_, kOp);
  return chosen;
}

void CudaEngine::broadcast(void* buf, int64_t bytes, int root, cudaStream_t stream) {
  const char* kOp = "broadcast";
  TORCH_CHECK(root >= 0 && root < size_, "pycoll::broadcast: root ", root, " is outside 0..", size_ - 1);
  if (bytes == 0 || size_ == 1) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_usable(kOp);
  if (same_device_) {
    same_device_->broadcast(buf, bytes, root, stream);
    return;
  }
  kernels::CopyArgs a = make_copy_args(ws_->handle(), OpCode::Broadcast, kernels::CopyMode::Broadcast);
  a.in = buf;
  a.out = buf;
  a.bytes = bytes;
  a.root = root;
  set_check(a, bytes, root);
  const gpu::Geometry g = gpu::plan_geometry(bytes, 1, chunk_bytes_, max_blocks_, small_max_blocks_);
  a.chunk = g.chunk;
  a.nchunks = g.nchunks;
  launch_copy_checked(g.blocks, stream, a, early_launch_, kOp);
}

void CudaEngine::reduce(const void* in, void* out, int64_t count, DType t, ReduceKind op, int root,
                        cudaStream_t stream) {
  const char* kOp = "reduce";
  TORCH_CHECK(root >= 0 && root < size_, "pycoll::reduce: root ", root, " is outside 0..", size_ - 1);
  TORCH_INTERNAL_ASSERT(rank_ != root || out != nullptr || count == 0, "pycoll::reduce: the root has no output");
  const KernelType kt = kernel_type(t, op, size_, kOp);
  const int64_t es = int64_t(dtype_size(kt.dtype));
  if (count == 0) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  if (size_ == 1) {
    copy_local(out, in, count * es, stream, kOp);
    return;
  }
  check_usable(kOp);
  kernels::ReduceArgs a = make_reduce_args(ws_->handle(), OpCode::Reduce, in, rank_ == root ? out : nullptr, kt);
  a.mode = kernels::ReduceMode::ReduceDirect;
  a.count = count;
  a.root = root;
  set_check(a, count, root);
  const gpu::Geometry g = gpu::plan_geometry(count, es, chunk_bytes_, max_blocks_, small_max_blocks_);
  launch_reduce_checked(g, stream, a, early_launch_, kOp);
}

void CudaEngine::all_to_all(const void* in, int64_t in_bytes, void* out, int64_t out_bytes,
                            const std::vector<int64_t>& send_bytes, const std::vector<int64_t>& send_offsets,
                            const std::vector<int64_t>& recv_bytes, const std::vector<int64_t>& recv_offsets,
                            cudaStream_t stream) {
  const char* kOp = "alltoall";
  const size_t n = size_t(size_);
  TORCH_CHECK(send_bytes.size() == n && send_offsets.size() == n && recv_bytes.size() == n && recv_offsets.size() == n,
              "pycoll::alltoall: byte counts and offsets need one entry per rank (", size_, ")");
  int64_t total = 0;
  for (size_t q = 0; q < n; ++q) {
    TORCH_CHECK(send_bytes[q] >= 0 && send_offsets[q] >= 0 && send_offsets[q] + send_bytes[q] <= in_bytes,
                "pycoll::alltoall: send slice for rank ", q, " (", send_bytes[q], " bytes at ", send_offsets[q],
                ") is outside the input (", in_bytes, " bytes)");
    TORCH_CHECK(recv_bytes[q] >= 0 && recv_offsets[q] >= 0 && recv_offsets[q] + recv_bytes[q] <= out_bytes,
                "pycoll::alltoall: receive slice for rank ", q, " (", recv_bytes[q], " bytes at ", recv_offsets[q],
                ") is outside the output (", out_bytes, " bytes)");
    total += send_bytes[q] + recv_bytes[q];
  }
  TORCH_CHECK(send_bytes[rank_] == recv_bytes[rank_], "pycoll::alltoall: this rank sends ", send_bytes[rank_],
              " bytes to itself but receives ", recv_bytes[rank_]);
  if (total == 0) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  if (size_ == 1) {
    copy_local(static_cast<char*>(out) + recv_offsets[0], static_cast<const char*>(in) + send_offsets[0], send_bytes[0],
               stream, kOp);
    return;
  }
  check_usable(kOp);
  kernels::CopyArgs a = make_copy_args(ws_->handle(), OpCode::AllToAll, kernels::CopyMode::AllToAll);
  a.in = in;
  a.out = out;
  a.chunk = ws_->layout().coll.slot_bytes;
  set_check(a, 0, 0);  // per-peer sizes differ legally; the receiver checks nothing else here
  for (size_t q = 0; q < n; ++q) {
    a.send_bytes[q] = send_bytes[q];
    a.send_off[q] = send_offsets[q];
    a.recv_bytes[q] = recv_bytes[q];
    a.recv_off[q] = recv_offsets[q];
  }
  launch_copy_checked(2 * gpu::all_to_all_channels(size_, ws_->layout().coll.nblocks, sms_), stream, a, early_launch_,
                      kOp);
}

namespace {

kernels::P2PArgs make_p2p_args(const cuda_ipc::DeviceHandle& h, void* buf, int64_t bytes, int peer, bool is_send,
                               const gpu::Geometry& g) {
  kernels::P2PArgs a{};
  a.h = h;
  a.peer = peer;
  a.is_send = is_send ? 1 : 0;
  a.buf = buf;
  a.bytes = bytes;
  a.chunk = g.chunk;
  a.nchunks = g.nchunks;
  a.blocks = g.blocks;
  return a;
}

// Before a receive of kP2PGateMinBlocks CTAs or more: the one-CTA gate (kernels::kP2PGate).
void gate_receive(const kernels::P2PArgs& a, cudaStream_t stream, const char* op) {
  if (a.is_send || !gpu::p2p_receive_gated(gpu::Geometry{a.blocks, a.chunk, a.nchunks})) return;
  kernels::P2PArgs gate = a;
  gate.flags |= kernels::kP2PGate;
  PYCOLL_CUDA_OK(gpu::launch_p2p(1, stream, gate, /*early=*/false), op, "gate launch");
}

}  // namespace

void CudaEngine::trace_p2p(kernels::P2PArgs& a, cudaStream_t stream) {
  if (!trace_) return;
  begin_trace(a.h, a.blocks, stream);
  if (a.h.trace != nullptr) a.flags |= kernels::kP2PTrace;
}

gpu::Geometry CudaEngine::plan_p2p(int64_t bytes) const {
  const cuda_ipc::ChannelSetLayout& p2p = ws_->layout().p2p;
  return gpu::plan_p2p(bytes, p2p.slot_bytes, p2p.nblocks, sms_, limits_.p2p_max_blocks);
}

// Send/recv kernels launch without programmatic dependent launch: an early-launched successor on the
// same stream would park up to 64 CTAs on SMs that the kernels its peers wait on need.
void CudaEngine::send(const void* buf, int64_t bytes, int peer, cudaStream_t stream) {
  const char* kOp = "send";
  TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, "pycoll::send: peer ", peer, " must be another rank in 0..",
              size_ - 1);
  // 0 bytes too: the receiver checks the length (plan_p2p)
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_usable(kOp);
  // The send kernel only reads buf (P2PArgs has one pointer for both directions).
  kernels::P2PArgs a = make_p2p_args(ws_->handle(), const_cast<void*>(buf), bytes, peer, true, plan_p2p(bytes));
  trace_p2p(a, stream);
  PYCOLL_CUDA_OK(gpu::launch_p2p(a.blocks, stream, a, /*early=*/false), kOp, "kernel launch");
}

void CudaEngine::recv(void* buf, int64_t bytes, int peer, cudaStream_t stream) {
  const char* kOp = "recv";
  TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, "pycoll::recv: peer ", peer, " must be another rank in 0..",
              size_ - 1);
  // 0 bytes too: the receiver checks the length (plan_p2p)
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_usable(kOp);
  kernels::P2PArgs a = make_p2p_args(ws_->handle(), buf, bytes, peer, false, plan_p2p(bytes));
  gate_receive(a, stream, kOp);  // before trace_p2p: the gate is not traced
  trace_p2p(a, stream);
  PYCOLL_CUDA_OK(gpu::launch_p2p(a.blocks, stream, a, /*early=*/false), kOp, "kernel launch");
}

gpu::P2PBatchPlan CudaEngine::plan_p2p_batch(const std::vector<gpu::P2PBatchItem>& items) const {
  const cuda_ipc::ChannelSetLayout& p2p = ws_->layout().p2p;
  return gpu::plan_p2p_batch(items, kernels::kMaxP2PBatchOps, p2p.slot_bytes, p2p.nblocks, sms_,
                             limits_.p2p_max_blocks);
}

void CudaEngine::p2p_batch(const std::vector<P2POp>& ops, const gpu::P2PBatchPlan& plan, cudaStream_t stream) {
  const char* kOp = "batch_isend_irecv";
  TORCH_CHECK(plan.fits && plan.geometry.size() == ops.size(),
              "pycoll::batch_isend_irecv: this batch cannot run in one launch (plan_p2p_batch)");
  for (const P2POp& o : ops) {
    TORCH_CHECK(o.peer >= 0 && o.peer < size_ && o.peer != rank_, "pycoll::", o.is_send ? "send" : "recv", ": peer ",
                o.peer, " must be another rank in 0..", size_ - 1);
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_usable(kOp);
  kernels::P2PBatchArgs a{};
  a.h = ws_->handle();
  for (size_t i = 0; i < ops.size(); ++i) {
    const gpu::Geometry& g = plan.geometry[i];
    kernels::P2PBatchOp& o = a.ops[a.nops++];
    o.buf = ops[i].buf;
    o.bytes = ops[i].bytes;
    o.chunk = g.chunk;
    o.nchunks = g.nchunks;
    o.peer = ops[i].peer;
    o.is_send = ops[i].is_send ? 1 : 0;
    o.blocks = g.blocks;
    o.first_block = plan.first_block[i];
  }
  // A batch of receives only is gated per large receive (a batch with a send is not: its peer's
  // batch may wait on that send before it sends what our gate would wait for).
  bool any_send = false;
  for (const P2POp& o : ops) any_send = any_send || o.is_send;
  for (size_t i = 0; i < ops.size() && !any_send; ++i)
    gate_receive(make_p2p_args(ws_->handle(), ops[i].buf, ops[i].bytes, ops[i].peer, false, plan.geometry[i]), stream,
                 kOp);
  PYCOLL_CUDA_OK(gpu::launch_p2p_batch(plan.grid, stream, a), kOp, "kernel launch");
}

void CudaEngine::barrier(cudaStream_t stream) {
  const char* kOp = "barrier";
  if (size_ == 1) return;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_usable(kOp);
  kernels::CopyArgs a = make_copy_args(ws_->handle(), OpCode::Barrier, kernels::CopyMode::Barrier);
  set_check(a, 0, 0);
  launch_copy_checked(1, stream, a, early_launch_, kOp);
}

}  // namespace pycoll

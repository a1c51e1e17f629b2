// SameDevicePath (same_device_path.h): the host protocol, its setup and teardown, and its two
// kernels (an elementwise reduction over the peers' staging buffers, and a gather of copies).
#include "cuda/same_device_path.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <c10/cuda/CUDAGuard.h>

#include "common/check.h"
#include "common/cuda_check.h"
#include "cuda/kernels/primitives.cuh"
#include "cuda/kernels/vec.cuh"
#include "common/brief_spin.h"
#include "cuda/kernel_type.h"
#include "cuda/reduce_kernel_table.h"
#include "transport/cuda_ipc/layout.h"

namespace pycoll {

namespace {

using cuda_ipc::kMaxRanks;
using KOp = kernels::ReduceOp;
using gpu::kernel_type;
using gpu::KernelType;
using Clock = std::chrono::steady_clock;

#define PYCOLL_SD_CHECK(expr, op, what) \
  PYCOLL_CUDA_CHECK(expr, "pycoll::", op, " (ranks sharing one GPU, the events path): ", what)

constexpr int kThreads = 512;
constexpr int64_t kMinBlockBytes = 32 << 10;  // less per CTA costs more in launch than it moves

// ---- kernels ----------------------------------------------------------------------------------

struct ReduceArgs {
  const void* src[kMaxRanks];  // in rank order
  void* dst;
  int32_t ns;
  int32_t div;  // > 1: Avg
  int64_t count;
  int64_t chunk;  // elements per CTA, a multiple of 16 bytes
};

template <DType D, class Op>
__global__ void __launch_bounds__(kThreads) reduce_kernel(ReduceArgs a) {
  using T = typename kernels::DTypeTraits<D>::T;
  __shared__ kernels::ReduceJob job;
  const int64_t begin = int64_t(blockIdx.x) * a.chunk;
  if (begin >= a.count) return;
  if (threadIdx.x == 0) {
    for (int s = 0; s < a.ns; ++s) job.src[s] = static_cast<const T*>(a.src[s]) + begin;
    job.dst[0] = static_cast<T*>(a.dst) + begin;
    job.ns = a.ns;
    job.nd = 1;
    job.div = a.div;
    job.count = a.count - begin < a.chunk ? a.count - begin : a.chunk;
  }
  __syncthreads();
  kernels::reduce_run<D, Op>(&job);
}

struct ReduceFamily {
  using Fn = void (*)(ReduceArgs);
  template <DType D, class Op>
  static Fn get() {
    return &reduce_kernel<D, Op>;
  }
};

// Job j (blockIdx.y) copies `bytes` from src[j] to dst[j]; blockIdx.x picks the chunk.
struct CopyArgs {
  const char* src[kMaxRanks];
  char* dst[kMaxRanks];
  int64_t bytes;
  int64_t chunk;  // a multiple of 16
};

__global__ void __launch_bounds__(kThreads) copy_kernel(CopyArgs a) {
  __shared__ kernels::CopyJob job;
  const int64_t begin = int64_t(blockIdx.x) * a.chunk;
  if (begin >= a.bytes) return;
  if (threadIdx.x == 0) {
    job.src = a.src[blockIdx.y] + begin;
    job.dst[0] = a.dst[blockIdx.y] + begin;
    job.nd = 1;
    job.bytes = a.bytes - begin < a.chunk ? a.bytes - begin : a.chunk;
  }
  __syncthreads();
  kernels::copy_run(&job, 1);
}

// CTAs and their share for `bytes` at most `max_blocks` CTAs; the share is a multiple of `align`.
void split(int64_t bytes, int max_blocks, int64_t align, int* blocks, int64_t* share) {
  int64_t b = (bytes + kMinBlockBytes - 1) / kMinBlockBytes;
  b = std::max<int64_t>(1, std::min<int64_t>(b, max_blocks));
  int64_t s = (bytes + b - 1) / b;
  s = (s + align - 1) / align * align;
  *blocks = int((bytes + s - 1) / s);
  *share = s;
}

// ---- dtype and reduce op -------------------------------------------------------------------

ReduceFamily::Fn reduce_fn(const KernelType& kt, DType t, ReduceKind r, const char* op) {
  const ReduceFamily::Fn fn = gpu::reduce_kernel_for<ReduceFamily>(kt.dtype, kt.op);
  TORCH_CHECK(fn != nullptr, "pycoll::", op, ": the CUDA engine does not reduce ", dtype_name(t), " with ",
              reduce_name(r));
  return fn;
}

// One reduce kernel: dst[i] = srcs[0][i] op srcs[1][i] op ... (rank order), n elements of es bytes.
void launch_reduce(ReduceFamily::Fn fn, const KernelType& kt, const void* const* srcs, int ns, void* dst, int64_t n,
                   int64_t es, int max_blocks, cudaStream_t s, const char* op) {
  ReduceArgs a{};
  for (int q = 0; q < ns; ++q) a.src[q] = srcs[q];
  a.dst = dst;
  a.ns = ns;
  a.div = kt.div;
  a.count = n;
  int blocks = 0;
  int64_t share = 0;
  split(n * es, max_blocks, 16, &blocks, &share);
  a.chunk = share / es;
  fn<<<blocks, kThreads, 0, s>>>(a);
  PYCOLL_SD_CHECK(cudaGetLastError(), op, "reduce kernel launch");
}

// ---- host helpers ------------------------------------------------------------------------------

std::string hex(const void* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s(2 * n, '0');
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = d[b[i] >> 4];
    s[2 * i + 1] = d[b[i] & 15];
  }
  return s;
}

bool unhex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n) return false;
  auto v = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(v(s[2 * i]) << 4 | v(s[2 * i + 1]));
  return true;
}

std::string random_token() {
  uint64_t x = 0;
  std::ifstream f("/dev/urandom", std::ios::binary);
  if (!f.read(reinterpret_cast<char*>(&x), sizeof(x))) {
    std::random_device rd;
    x = (uint64_t(rd()) << 32) ^ rd();
  }
  x ^= uint64_t(getpid()) << 20;
  return hex(&x, sizeof(x));
}

std::string pid_namespace() {
  char buf[64] = {0};
  const ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, size_t(n)) : std::string();
}

// What each rank publishes in the Store at setup.
struct Info {
  int32_t pid;
  int32_t device;
  int64_t staging;
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t ready;
  cudaIpcEventHandle_t done;
  char bus_id[32];  // the GPU: every rank must be on this one
  char pid_ns[48];  // pids mean the same only within one pid namespace
};

// An op's identity, which every rank's round must match: op | dtype | reduce | root, count, round.
struct Desc {
  uint64_t what;
  uint64_t count;
  uint64_t piece;
};

Desc desc_of(OpCode op, DType t, ReduceKind r, int root, int64_t count, int64_t piece) {
  return {uint64_t(uint32_t(op)) | uint64_t(uint32_t(t) & 0xff) << 8 | uint64_t(uint32_t(r) & 0xff) << 16 |
              uint64_t(uint32_t(root) & 0xffff) << 24,
          uint64_t(count), uint64_t(piece)};
}

std::string describe(const Desc& d) {
  const auto op = OpCode(int32_t(d.what & 0xff));
  std::string s = str(op_name(op), " of ", d.count,
                      op == OpCode::AllReduce || op == OpCode::ReduceScatter
                          ? str(" ", dtype_name(DType(int32_t(d.what >> 8 & 0xff))), " elements, ",
                                reduce_name(ReduceKind(int32_t(d.what >> 16 & 0xff))))
                          : std::string(" bytes"));
  if (op == OpCode::Broadcast) s += str(" from rank ", d.what >> 24 & 0xffff);
  return str(s, " (piece ", d.piece, ")");
}

std::string rank_list(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

}  // namespace

// ---- shared memory -----------------------------------------------------------------------------

// One cache line per rank: only rank q writes line q. ready/done count rounds since setup and only
// grow, so a waiter compares with >= and nothing is ever reset.
struct alignas(64) SdLine {
  std::atomic<int64_t> ready;
  std::atomic<int64_t> done;
  std::atomic<uint64_t> desc[3];  // the round published in `ready` (Desc)
  std::atomic<int32_t> quiet;     // 1: in teardown, and this rank's GPU no longer reads the peers' W
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "shared-memory counters must be lock-free");

struct SameDevicePath::Shared {
  alignas(64) std::atomic<int32_t> stopped_by;  // 0, or 1 + the rank that failed or aborted
  SdLine line[kMaxRanks];
};

// One round: what this rank stages into its W and what it makes of the peers' W.
struct SameDevicePath::Round {
  const char* op;
  Desc desc;
  bool writes;                    // (b) and (c): this rank writes its W this round
  int reads;                      // (f): -1 = every peer's W, -2 = none, else that rank's
  std::function<void()> stage;    // (c), after (b)
  std::function<void()> consume;  // (g), after (f)
};

// ---- setup and teardown ------------------------------------------------------------------------

SameDevicePath::SameDevicePath(const Rendezvous& rv, int rank, int size, int device, std::chrono::milliseconds timeout,
                               int64_t staging_bytes)
    : rank_(rank), size_(size), device_(device), timeout_(timeout) {
  TORCH_CHECK(size >= 1 && size <= kMaxRanks && rank >= 0 && rank < size, "pycoll: SameDevicePath: rank ", rank, " of ",
              size, " (at most ", kMaxRanks, " ranks)");
  staging_ = std::max<int64_t>(4096, staging_bytes / 4096 * 4096);
  if (size == 1) return;  // no protocol: plain copies
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const char* what = "setup";
  const std::string wait_what = "pycoll: ranks sharing one GPU could not set up their events path";
  const std::string wait_why =
      "Every rank of the group sets it up when the group's CUDA engine starts; the ranks named crashed, hung, or "
      "did not reach that point.";
  const std::string base = rv.prefix + "same_device/";
  bool created = false;
  try {
    int sms = 0;
    PYCOLL_SD_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), what, "SM count");
    max_blocks_ = std::max(1, 2 * sms);

    // Rank 0 creates the counters' segment; the name goes through the Store.
    const size_t shm_bytes = (sizeof(Shared) + 4095) / 4096 * 4096;
    if (rank == 0) {
      shm_name_ = "/pycoll-sd-" + random_token();
      shm_ = ShmSegment::create(shm_name_, shm_bytes);
      created = true;
      new (shm_.base()) Shared();
      rv.set(base + "shm", shm_name_);
    } else {
      rv.wait_every_rank({base + "shm"}, timeout, wait_what, wait_why);  // one key: rank 0's
      shm_name_ = rv.get(base + "shm");
      shm_ = ShmSegment::open(shm_name_, shm_bytes);
    }
    sh_ = reinterpret_cast<Shared*>(shm_.base());

    PYCOLL_SD_CHECK(cudaMalloc(&mine_, size_t(staging_)), what, str("cudaMalloc of ", staging_, " staging bytes"));
    ready_ev_.assign(size, nullptr);
    done_ev_.assign(size, nullptr);
    staging_of_.assign(size, nullptr);
    staging_of_[rank] = mine_;
    const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
    PYCOLL_SD_CHECK(cudaEventCreateWithFlags(&ready_ev_[rank], flags), what, "cudaEventCreateWithFlags");
    PYCOLL_SD_CHECK(cudaEventCreateWithFlags(&done_ev_[rank], flags), what, "cudaEventCreateWithFlags");

    Info me;
    std::memset(&me, 0, sizeof(me));
    me.pid = int32_t(getpid());
    me.device = device;
    me.staging = staging_;
    PYCOLL_SD_CHECK(cudaIpcGetMemHandle(&me.mem, mine_), what, "cudaIpcGetMemHandle");
    PYCOLL_SD_CHECK(cudaIpcGetEventHandle(&me.ready, ready_ev_[rank]), what, "cudaIpcGetEventHandle");
    PYCOLL_SD_CHECK(cudaIpcGetEventHandle(&me.done, done_ev_[rank]), what, "cudaIpcGetEventHandle");
    PYCOLL_SD_CHECK(cudaDeviceGetPCIBusId(me.bus_id, sizeof(me.bus_id), device), what, "cudaDeviceGetPCIBusId");
    const std::string ns = pid_namespace();
    std::snprintf(me.pid_ns, sizeof(me.pid_ns), "%s", ns.c_str());
    // Published after this rank has mapped the segment: once every rank's key is there, rank 0
    // removes the name, so no exit path leaves it in /dev/shm.
    rv.set(base + "info/" + std::to_string(rank), hex(&me, sizeof(me)));
    std::vector<std::string> keys;
    for (int q = 0; q < size; ++q) keys.push_back(base + "info/" + std::to_string(q));
    rv.wait_every_rank(keys, timeout, wait_what, wait_why);
    if (rank == 0) ShmSegment::unlink(shm_name_);

    pids_.assign(size, 0);
    check_pid_.assign(size, false);
    for (int q = 0; q < size; ++q) {
      Info p;
      TORCH_CHECK(unhex(rv.get(keys[q]), &p, sizeof(p)), "pycoll: rank ", q,
                  "'s same-device handles are malformed (a different pycollectives build?)");
      TORCH_CHECK(p.staging == staging_, "pycoll: ranks sharing one GPU use different staging sizes (rank ", rank, ": ",
                  staging_, " bytes, rank ", q, ": ", p.staging,
                  " bytes): set PYCOLL_CUDA_SAME_DEVICE_STAGING_KIB alike on every rank");
      TORCH_CHECK(std::strncmp(p.bus_id, me.bus_id, sizeof(me.bus_id)) == 0, "pycoll: rank ", q, " is on GPU ",
                  p.bus_id, " and rank ", rank, " on GPU ", me.bus_id,
                  ": the events path serves groups whose ranks all share one GPU");
      pids_[q] = p.pid;
      check_pid_[q] = q != rank && !ns.empty() && std::strncmp(p.pid_ns, me.pid_ns, sizeof(me.pid_ns)) == 0;
      if (q == rank) continue;
      PYCOLL_SD_CHECK(cudaIpcOpenMemHandle(&staging_of_[q], p.mem, cudaIpcMemLazyEnablePeerAccess), what,
                      str("cudaIpcOpenMemHandle of rank ", q, "'s staging"));
      PYCOLL_SD_CHECK(cudaIpcOpenEventHandle(&ready_ev_[q], p.ready), what,
                      str("cudaIpcOpenEventHandle of rank ", q, "'s ready event"));
      PYCOLL_SD_CHECK(cudaIpcOpenEventHandle(&done_ev_[q], p.done), what,
                      str("cudaIpcOpenEventHandle of rank ", q, "'s done event"));
    }
  } catch (...) {
    if (created) ShmSegment::unlink(shm_name_);
    if (sh_ != nullptr) sh_->stopped_by.store(rank + 1, std::memory_order_release);
    release();
    throw;
  }
}

SameDevicePath::~SameDevicePath() {
  if (size_ == 1) return;
  int prev = -1;
  const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ && cudaSetDevice(device_) == cudaSuccess;
  // Freed staging must be idle: a peer's last kernel may still read W_r. Each rank says when its
  // own reads are over (its last D completed), then waits for every peer to say so; no rank
  // touches a peer's event here, since that peer may be destroying it. Bounded, and skipped once
  // the group is broken (a dead peer's work may never complete).
  try {
    if (sh_ != nullptr && broken_.empty() && !aborted_.load() && sh_->stopped_by.load() == 0) {
      const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(10));
      while (cudaEventQuery(done_ev_[rank_]) == cudaErrorNotReady && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      sh_->line[rank_].quiet.store(1, std::memory_order_release);
      for (int q = 0; q < size_; ++q) {
        while (sh_->line[q].quiet.load(std::memory_order_acquire) == 0 && sh_->stopped_by.load() == 0 &&
               peer_alive(q) && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      }
    }
    // A peer that still issues rounds learns at once that this rank is gone, not at its timeout.
    if (sh_ != nullptr) {
      int32_t none = 0;
      sh_->stopped_by.compare_exchange_strong(none, rank_ + 1);
    }
  } catch (...) {}
  release();
  if (switched) (void)cudaSetDevice(prev);
}

void SameDevicePath::release() noexcept {
  for (int q = 0; q < int(staging_of_.size()); ++q) {
    if (q != rank_ && staging_of_[q] != nullptr) (void)cudaIpcCloseMemHandle(staging_of_[q]);
    staging_of_[q] = nullptr;
  }
  for (auto* v : {&ready_ev_, &done_ev_}) {
    for (auto& e : *v) {
      if (e != nullptr) (void)cudaEventDestroy(e);
      e = nullptr;
    }
  }
  if (mine_ != nullptr) (void)cudaFree(mine_);
  mine_ = nullptr;
  (void)cudaGetLastError();
  sh_ = nullptr;
  shm_ = ShmSegment();
}

void SameDevicePath::abort() noexcept {
  aborted_.store(true);
  if (sh_ != nullptr) {
    int32_t none = 0;
    sh_->stopped_by.compare_exchange_strong(none, rank_ + 1);
  }
}

// ---- host waits --------------------------------------------------------------------------------

bool SameDevicePath::peer_alive(int q) const {
  if (q == rank_ || !check_pid_[q]) return true;
  const pid_t pid = pids_[q];
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A zombie (exited, not yet reaped by its parent) still answers kill(pid, 0).
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return true;  // unreadable: assume alive, the timeout still applies
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return true;
  const char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

void SameDevicePath::fail(const std::string& why) {
  if (broken_.empty()) broken_ = why;
  // The peers stop waiting for this rank at once instead of at their timeout.
  if (sh_ != nullptr) {
    int32_t none = 0;
    sh_->stopped_by.compare_exchange_strong(none, rank_ + 1);
  }
  throw GroupBroken(why);
}

void SameDevicePath::wait_peers(bool done_counter, int64_t target, const char* op, const char* stage) {
  auto missing = [&](std::vector<int>* out) {
    bool any = false;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const SdLine& l = sh_->line[q];
      if ((done_counter ? l.done : l.ready).load(std::memory_order_acquire) < target) {
        any = true;
        if (out == nullptr) break;
        out->push_back(q);
      }
    }
    return any;
  };
  if (!missing(nullptr)) return;
  auto head = [&] {
    return str("pycoll::", op, " (", size_, " ranks sharing GPU ", device_, ", the events path), round ", target, ": ");
  };
  // Peers' hosts usually arrive within microseconds: spin first, then yield, then sleep.
  const auto start = Clock::now();
  auto last_alive_check = start;
  for (uint64_t i = 0;; ++i) {
    if (i < 4096) {
      cpu_pause();
      if ((i & 63) != 63) {
        if (!missing(nullptr)) return;
        continue;
      }
    } else if (Clock::now() - start < std::chrono::milliseconds(1)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!missing(nullptr)) return;
    const int32_t stopped = sh_->stopped_by.load(std::memory_order_acquire);
    if (aborted_.load() || stopped == rank_ + 1) {
      fail(str(head(), "the group was aborted while this rank waited for its peers (", stage, ")"));
    }
    if (stopped != 0) {
      fail(str(head(), "rank ", stopped - 1,
               " failed, was aborted or left the group, so the group cannot continue (this rank waited ",
               "for its peers: ", stage, ")"));
    }
    const auto now = Clock::now();
    if (now - last_alive_check >= std::chrono::milliseconds(20) || now - start >= timeout_) {
      last_alive_check = now;
      std::vector<int> late;
      missing(&late);
      for (int q : late) {
        if (!peer_alive(q)) {
          fail(str(head(), "rank ", q, " (pid ", pids_[q], ") exited while this rank waited for it (", stage, ")"));
        }
      }
      if (now - start >= timeout_) {
        if (late.empty()) return;
        // " timeout " and "timed out": what torch's tests and users' log searches look for.
        fail(str(head(), "timed out waiting for rank(s) ", rank_list(late), " (", stage, ") past the group's timeout (",
                 timeout_.count(), " ms); they may have crashed, hung, or called a different collective"));
      }
    }
  }
}

void SameDevicePath::check_usable(const char* op, cudaStream_t s) {
  if (!broken_.empty()) {
    throw GroupBroken(str("pycoll::", op, ": the group is unusable after an earlier error: ", broken_));
  }
  if (aborted_.load()) fail(str("pycoll::", op, ": the group was aborted"));
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  PYCOLL_SD_CHECK(cudaStreamIsCapturing(s, &st), op, "cudaStreamIsCapturing");
  if (st != cudaStreamCaptureStatusNone) {
    throw std::invalid_argument(str(
        "pycoll::", op, ": the stream is capturing a CUDA graph, but the ranks of this group share one GPU and ",
        "their events path (PYCOLL_CUDA_SAME_DEVICE=auto or events) orders them with host waits and IPC events, ",
        "which a graph cannot hold. ",
        "Ranks sharing one GPU capture collectives only with PYCOLL_CUDA_SAME_DEVICE=kernels (under the MPS daemon); "
        "or issue this collective outside the capture."));
  }
}

// ---- one round ---------------------------------------------------------------------------------
//
// Why each cudaStreamWaitEvent waits for the record it means: it waits for the event's most recent
// record at the time of the call (a later record does not move it), so the record must be there
// and no newer one.
//   (b) round k waits D_q. q recorded D_q for round k-1 before publishing done_q = k-1, which (a)
//       waited for. q records D_q for round k only after its (e) has seen ready_r >= k, which this
//       rank publishes in (d), after (b). So the latest record is round k-1's.
//   (f) round k waits R_q. q recorded R_q for round k before publishing ready_q = k, which (e)
//       waited for. q records R_q for round k+1 only after its (a) has seen done_r >= k, which this
//       rank publishes in (h), after (f). So the latest record is round k's.
// No cross-process GPU deadlock: every wait names a record that was already enqueued when the wait
// was enqueued, so the GPU dependencies follow the order in which the hosts enqueued them and form
// no cycle; every stream's work completes once the earlier work in that order has, in whatever
// order the time-sliced contexts run. The hosts never wait for the GPU, only for each other's
// enqueueing, which is bounded by the timeout.
void SameDevicePath::run_round(const Round& rd, cudaStream_t s) {
  const int64_t k = ++round_;
  const char* op = rd.op;
  try {
    wait_peers(true, k - 1, op, "the peers finishing the previous round");  // (a)
    // This rank's own D in every round: the previous round may have run on another stream, and this
    // round's D must cover its reads too (a round that writes nothing would otherwise record D
    // with none of the previous reads before it).
    PYCOLL_SD_CHECK(cudaStreamWaitEvent(s, done_ev_[rank_], 0), op, "cudaStreamWaitEvent on this rank's D");
    if (rd.writes) {
      for (int q = 0; q < size_; ++q) {  // (b)
        if (q == rank_) continue;
        PYCOLL_SD_CHECK(cudaStreamWaitEvent(s, done_ev_[q], 0), op, str("cudaStreamWaitEvent on rank ", q, "'s D"));
      }
      if (rd.stage) rd.stage();  // (c)
    }
    PYCOLL_SD_CHECK(cudaEventRecord(ready_ev_[rank_], s), op, "cudaEventRecord of R");  // (d)
    SdLine& mine = sh_->line[rank_];
    mine.desc[0].store(rd.desc.what, std::memory_order_relaxed);
    mine.desc[1].store(rd.desc.count, std::memory_order_relaxed);
    mine.desc[2].store(rd.desc.piece, std::memory_order_relaxed);
    mine.ready.store(k, std::memory_order_release);
    wait_peers(false, k, op, "the peers staging their input");  // (e)
    // A peer's desc stays until this rank publishes done_r = k (its next round waits for that).
    for (int q = 0; q < size_; ++q) {
      const SdLine& l = sh_->line[q];
      const Desc d{l.desc[0].load(std::memory_order_relaxed), l.desc[1].load(std::memory_order_relaxed),
                   l.desc[2].load(std::memory_order_relaxed)};
      if (d.what != rd.desc.what || d.count != rd.desc.count || d.piece != rd.desc.piece) {
        fail(str("pycoll::", op, ": the ranks sharing this GPU called different collectives: rank ", rank_, " ",
                 describe(rd.desc), ", rank ", q, " ", describe(d)));
      }
    }
    for (int q = 0; q < size_; ++q) {  // (f)
      if (q == rank_ || (rd.reads != -1 && rd.reads != q)) continue;
      PYCOLL_SD_CHECK(cudaStreamWaitEvent(s, ready_ev_[q], 0), op, str("cudaStreamWaitEvent on rank ", q, "'s R"));
    }
    if (rd.consume) rd.consume();                                                      // (g)
    PYCOLL_SD_CHECK(cudaEventRecord(done_ev_[rank_], s), op, "cudaEventRecord of D");  // (h)
    mine.done.store(k, std::memory_order_release);
  } catch (const GroupBroken&) {
    throw;
  } catch (const std::exception& e) {
    // A CUDA error mid-round leaves the rounds out of step: the group cannot continue.
    if (broken_.empty()) broken_ = e.what();
    if (sh_ != nullptr) {
      int32_t none = 0;
      sh_->stopped_by.compare_exchange_strong(none, rank_ + 1);
    }
    throw;
  }
}

// ---- collectives -------------------------------------------------------------------------------

Algo SameDevicePath::all_reduce(const void* in, void* out, int64_t count, DType t, ReduceKind op, cudaStream_t s) {
  const char* name = "all_reduce";
  const KernelType kt = kernel_type(t, op, size_, name);
  const ReduceFamily::Fn fn = reduce_fn(kt, t, op, name);
  const int64_t es = int64_t(dtype_size(t));
  if (count <= 0) return Algo::OneShot;
  if (size_ == 1) {
    if (in != out)
      PYCOLL_SD_CHECK(cudaMemcpyAsync(out, in, size_t(count * es), cudaMemcpyDeviceToDevice, s), name, "copy");
    return Algo::OneShot;
  }
  check_usable(name, s);
  const int64_t per = staging_ / es;  // a multiple of 16 bytes
  for (int64_t off = 0, piece = 0; off < count; off += per, ++piece) {
    const int64_t n = std::min(per, count - off);
    Round rd{name, desc_of(OpCode::AllReduce, t, op, 0, count, piece), true, -1, nullptr, nullptr};
    rd.stage = [&] {
      PYCOLL_SD_CHECK(
          cudaMemcpyAsync(mine_, static_cast<const char*>(in) + off * es, size_t(n * es), cudaMemcpyDeviceToDevice, s),
          name, "copy into the staging buffer");
    };
    rd.consume = [&] {
      launch_reduce(fn, kt, staging_of_.data(), size_, static_cast<char*>(out) + off * es, n, es, max_blocks_, s, name);
    };
    run_round(rd, s);
  }
  return Algo::OneShot;
}

void SameDevicePath::reduce_scatter(const void* in, void* out, int64_t m, DType t, ReduceKind op, cudaStream_t s) {
  const char* name = "reduce_scatter";
  const KernelType kt = kernel_type(t, op, size_, name);
  const ReduceFamily::Fn fn = reduce_fn(kt, t, op, name);
  const int64_t es = int64_t(dtype_size(t));
  if (m <= 0) return;
  if (size_ == 1) {
    if (in != out) PYCOLL_SD_CHECK(cudaMemcpyAsync(out, in, size_t(m * es), cudaMemcpyDeviceToDevice, s), name, "copy");
    return;
  }
  check_usable(name, s);
  // W holds this round's piece of every rank's block, block q at q * per elements (16-byte aligned).
  const int64_t per = staging_ / size_ / 16 * 16 / es;
  for (int64_t off = 0, piece = 0; off < m; off += per, ++piece) {
    const int64_t n = std::min(per, m - off);
    Round rd{name, desc_of(OpCode::ReduceScatter, t, op, 0, m, piece), true, -1, nullptr, nullptr};
    rd.stage = [&] {
      CopyArgs a{};
      for (int q = 0; q < size_; ++q) {
        a.src[q] = static_cast<const char*>(in) + (q * m + off) * es;
        a.dst[q] = static_cast<char*>(mine_) + q * per * es;
      }
      a.bytes = n * es;
      int blocks = 0;
      split(n * es, std::max(1, max_blocks_ / size_), 16, &blocks, &a.chunk);
      copy_kernel<<<dim3(blocks, size_), kThreads, 0, s>>>(a);
      PYCOLL_SD_CHECK(cudaGetLastError(), name, "staging copy launch");
    };
    rd.consume = [&] {
      const void* blocks[kMaxRanks];
      for (int q = 0; q < size_; ++q) blocks[q] = static_cast<const char*>(staging_of_[q]) + rank_ * per * es;
      launch_reduce(fn, kt, blocks, size_, static_cast<char*>(out) + off * es, n, es, max_blocks_, s, name);
    };
    run_round(rd, s);
  }
}

void SameDevicePath::all_gather(const void* in, void* out, int64_t bytes, cudaStream_t s) {
  const char* name = "all_gather";
  if (bytes <= 0) return;
  if (size_ == 1) {
    if (in != out) PYCOLL_SD_CHECK(cudaMemcpyAsync(out, in, size_t(bytes), cudaMemcpyDeviceToDevice, s), name, "copy");
    return;
  }
  check_usable(name, s);
  for (int64_t off = 0, piece = 0; off < bytes; off += staging_, ++piece) {
    const int64_t n = std::min(staging_, bytes - off);
    Round rd{name,   desc_of(OpCode::AllGather, DType::UInt8, ReduceKind::Sum, 0, bytes, piece), true, -1, nullptr,
             nullptr};
    rd.stage = [&] {
      PYCOLL_SD_CHECK(
          cudaMemcpyAsync(mine_, static_cast<const char*>(in) + off, size_t(n), cudaMemcpyDeviceToDevice, s), name,
          "copy into the staging buffer");
    };
    rd.consume = [&] {
      CopyArgs a{};
      for (int q = 0; q < size_; ++q) {
        a.src[q] = static_cast<const char*>(staging_of_[q]);
        a.dst[q] = static_cast<char*>(out) + q * bytes + off;
      }
      a.bytes = n;
      int blocks = 0;
      split(n, std::max(1, max_blocks_ / size_), 16, &blocks, &a.chunk);
      copy_kernel<<<dim3(blocks, size_), kThreads, 0, s>>>(a);
      PYCOLL_SD_CHECK(cudaGetLastError(), name, "gather kernel launch");
    };
    run_round(rd, s);
  }
}

void SameDevicePath::broadcast(void* buf, int64_t bytes, int root, cudaStream_t s) {
  const char* name = "broadcast";
  TORCH_CHECK(root >= 0 && root < size_, "pycoll::broadcast: root ", root, " is not a rank of this group of ", size_);
  if (bytes <= 0 || size_ == 1) return;
  check_usable(name, s);
  const bool is_root = rank_ == root;
  for (int64_t off = 0, piece = 0; off < bytes; off += staging_, ++piece) {
    const int64_t n = std::min(staging_, bytes - off);
    Round rd{name,    desc_of(OpCode::Broadcast, DType::UInt8, ReduceKind::Sum, root, bytes, piece),
             is_root, is_root ? -2 : root,
             nullptr, nullptr};
    if (is_root) {
      rd.stage = [&] {
        PYCOLL_SD_CHECK(
            cudaMemcpyAsync(mine_, static_cast<const char*>(buf) + off, size_t(n), cudaMemcpyDeviceToDevice, s), name,
            "copy into the staging buffer");
      };
    } else {
      rd.consume = [&] {
        PYCOLL_SD_CHECK(
            cudaMemcpyAsync(static_cast<char*>(buf) + off, staging_of_[root], size_t(n), cudaMemcpyDeviceToDevice, s),
            name, "copy from the root's staging buffer");
      };
    }
    run_round(rd, s);
  }
}

double SameDevicePath::time_small_all_reduce_us(int ops) {
  const char* name = "all_reduce";
  float* buf = nullptr;
  cudaStream_t s = nullptr;
  PYCOLL_SD_CHECK(cudaMalloc(reinterpret_cast<void**>(&buf), sizeof(float)), name, "cudaMalloc of the probe");
  double us = 0;
  try {
    PYCOLL_SD_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), name, "cudaStreamCreateWithFlags");
    PYCOLL_SD_CHECK(cudaMemsetAsync(buf, 0, sizeof(float), s), name, "cudaMemsetAsync");
    all_reduce(buf, buf, 1, DType::Float32, ReduceKind::Sum, s);
    PYCOLL_SD_CHECK(cudaStreamSynchronize(s), name, "cudaStreamSynchronize");
    const auto t0 = Clock::now();
    for (int i = 0; i < ops; ++i) all_reduce(buf, buf, 1, DType::Float32, ReduceKind::Sum, s);
    PYCOLL_SD_CHECK(cudaStreamSynchronize(s), name, "cudaStreamSynchronize");
    us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / std::max(ops, 1);
  } catch (...) {
    if (s != nullptr) (void)cudaStreamDestroy(s);
    (void)cudaFree(buf);
    throw;
  }
  (void)cudaStreamDestroy(s);
  (void)cudaFree(buf);
  return us;
}

}  // namespace pycoll

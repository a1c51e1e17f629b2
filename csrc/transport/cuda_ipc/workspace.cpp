// Compiled only in CUDA builds (setup.py compiles every .cpp; CPU-only builds skip this body).
#if defined(PYCOLL_WITH_CUDA) && PYCOLL_WITH_CUDA

#include "transport/cuda_ipc/workspace.h"

#include "transport/cuda_ipc/check_word.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include "common/cuda_check.h"
#include "common/types.h"

namespace pycoll {
namespace cuda_ipc {

namespace {

#define PYCOLL_IPC_CHECK(expr, what) PYCOLL_CUDA_CHECK(expr, "pycoll::cuda_ipc: ", what)

constexpr uint32_t kMagic = 0x70434950;  // "pCIP"
// 2: the LL region; 3: split one-shot progress words; 4: claimed split; 5: registered protocols' regions
constexpr uint32_t kVersion = 5;

// What a rank publishes about itself. Raw bytes through the Store: every rank runs this binary.
struct PeerInfo {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t size;
  int64_t total_bytes;
  int64_t coll_slot_bytes;
  char host[128];
  char boot_id[64];
  char bus_id[32];
  cudaIpcMemHandle_t handle;
};

void copy_str(char* dst, size_t cap, const std::string& s) {
  std::memset(dst, 0, cap);
  std::memcpy(dst, s.data(), std::min(cap - 1, s.size()));
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  if (f) std::getline(f, s);
  return s;
}

}  // namespace

IpcWorkspace::IpcWorkspace(const Rendezvous& rv, int rank, int size, int device, std::chrono::milliseconds timeout,
                           int64_t coll_slot_bytes, int coll_blocks, const std::vector<ProtocolRegion>& regions,
                           int64_t p2p_slot_bytes, bool same_device)
    : rank_(rank), size_(size), device_(device), same_device_(same_device) {
  TORCH_CHECK(size >= 1 && size <= kMaxRanks, "pycoll::cuda_ipc: world size ", size, " is outside 1..", kMaxRanks,
              " (the CUDA engine serves one host)");
  TORCH_CHECK(rank >= 0 && rank < size, "pycoll::cuda_ipc: rank ", rank, " is outside 0..", size - 1);
  TORCH_CHECK(rv.set && rv.get && rv.wait_every_rank, "pycoll::cuda_ipc: the rendezvous lacks set, get or wait");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  try {
    init(rv, timeout, coll_slot_bytes, coll_blocks, regions, p2p_slot_bytes);
  } catch (...) {
    release_mappings();
    if (host_err_ != nullptr) (void)cudaFreeHost(host_err_);
    host_err_ = nullptr;
    throw;
  }
}

void IpcWorkspace::init(const Rendezvous& rv, std::chrono::milliseconds timeout, int64_t coll_slot_bytes,
                        int coll_blocks, const std::vector<ProtocolRegion>& regions, int64_t p2p_slot_bytes) {
  const int rank = rank_;
  const int size = size_;
  const int device = device_;

  void* h = nullptr;
  PYCOLL_IPC_CHECK(cudaHostAlloc(&h, sizeof(HostErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable),
                   "cudaHostAlloc(error record)");
  std::memset(h, 0, sizeof(HostErrorRecord));
  host_err_ = static_cast<HostErrorRecord*>(h);
  void* d = nullptr;
  PYCOLL_IPC_CHECK(cudaHostGetDevicePointer(&d, h, 0), "cudaHostGetDevicePointer");

  TORCH_CHECK(coll_slot_bytes == 0 || (coll_slot_bytes >= 4096 && coll_slot_bytes % 4096 == 0),
              "pycoll::cuda_ipc: slot size ", coll_slot_bytes, " is not a positive multiple of 4 KiB");
  TORCH_CHECK(p2p_slot_bytes == 0 || (p2p_slot_bytes >= 4096 && p2p_slot_bytes % 4096 == 0),
              "pycoll::cuda_ipc: p2p slot size ", p2p_slot_bytes, " is not a positive multiple of 4 KiB");
  TORCH_CHECK(coll_blocks >= kCollBlocks && coll_blocks <= kMaxCollBlocks, "pycoll::cuda_ipc: ", coll_blocks,
              " channels per peer pair is outside ", kCollBlocks, "..", kMaxCollBlocks);
  TORCH_CHECK(int(regions.size()) <= kMaxProtocolRegions, "pycoll::cuda_ipc: ", regions.size(),
              " protocol regions, at most ", kMaxProtocolRegions);
  for (const ProtocolRegion& r : regions)
    TORCH_CHECK(r.bytes >= 0 && r.param >= 0, "pycoll::cuda_ipc: negative protocol region size");
  layout_ = make_layout(size, coll_slot_bytes, coll_blocks, regions.data(), int(regions.size()), p2p_slot_bytes);
  handle_.rank = rank;
  handle_.nranks = size;
  handle_.layout = layout_;
  handle_.timeout_ns = uint64_t(timeout.count() > 0 ? timeout.count() : 1) * 1000000ull;
  handle_.err = static_cast<HostErrorRecord*>(d);
  peers_.assign(size, nullptr);

  if (size == 1) {  // nothing to map: the engine never launches a kernel for one rank
    reachable_ = true;
    return;
  }

  PYCOLL_IPC_CHECK(cudaMalloc(reinterpret_cast<void**>(&local_), size_t(layout_.total_bytes)),
                   "cudaMalloc(workspace of " + std::to_string(layout_.total_bytes) + " bytes)");
  PYCOLL_IPC_CHECK(cudaMemset(local_, 0, size_t(layout_.total_bytes)), "cudaMemset(workspace)");
  PYCOLL_IPC_CHECK(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // zeroed before any peer maps it

  PeerInfo mine;
  std::memset(&mine, 0, sizeof(mine));
  mine.magic = kMagic;
  mine.version = kVersion;
  mine.rank = rank;
  mine.size = size;
  mine.total_bytes = layout_.total_bytes;
  mine.coll_slot_bytes = layout_.coll.slot_bytes;
  copy_str(mine.host, sizeof(mine.host), host_name());
  copy_str(mine.boot_id, sizeof(mine.boot_id), boot_id());
  PYCOLL_IPC_CHECK(cudaDeviceGetPCIBusId(mine.bus_id, sizeof(mine.bus_id), device), "cudaDeviceGetPCIBusId");
  PYCOLL_IPC_CHECK(cudaIpcGetMemHandle(&mine.handle, local_), "cudaIpcGetMemHandle");

  // Round 1: every rank's handle.
  const std::string base = rv.prefix + "/pycoll_cuda_ipc/";
  rv.set(base + "info/" + std::to_string(rank), std::string(reinterpret_cast<const char*>(&mine), sizeof(PeerInfo)));
  std::vector<std::string> keys;
  for (int q = 0; q < size; ++q) keys.push_back(base + "info/" + std::to_string(q));
  rv.wait_every_rank(keys, timeout, "pycoll::cuda_ipc: peers' workspace handles",
                     "Every rank publishes its handle while its CUDA engine starts; the ranks named crashed, hung, "
                     "or failed earlier in the start.");
  std::vector<PeerInfo> info(size);
  for (int q = 0; q < size; ++q) {
    const std::string v = rv.get(keys[q]);
    TORCH_CHECK(v.size() == sizeof(PeerInfo), "pycoll::cuda_ipc: rank ", q, " published ", v.size(),
                " bytes of workspace info, expected ", sizeof(PeerInfo), " (different pycollectives builds?)");
    std::memcpy(&info[q], v.data(), sizeof(PeerInfo));
  }
  for (int q = 0; q < size && !gpus_shared_; ++q) {
    for (int p = 0; p < q && !gpus_shared_; ++p) {
      gpus_shared_ = std::strncmp(info[p].bus_id, info[q].bus_id, sizeof(info[q].bus_id)) == 0;
    }
  }

  // This rank's verdict: can it map every peer?
  std::string why;
  for (int q = 0; q < size && why.empty(); ++q) {
    if (q == rank) continue;
    const PeerInfo& p = info[q];
    // Every rank sees a mismatch the same way, so every rank throws here (no rank is left waiting).
    TORCH_CHECK(p.magic == kMagic && p.version == kVersion && p.size == size, "pycoll::cuda_ipc: rank ", q,
                " runs a different pycollectives build");
    TORCH_CHECK(p.total_bytes == mine.total_bytes && p.coll_slot_bytes == mine.coll_slot_bytes,
                "pycoll::cuda_ipc: rank ", q, " uses a workspace of ", p.total_bytes, " bytes with ", p.coll_slot_bytes,
                "-byte slots, this rank ", mine.total_bytes, " and ", mine.coll_slot_bytes,
                " (set PYCOLL_CUDA_SLOT_KIB and PYCOLL_CUDA_MAX_BLOCKS alike on every rank)");
    if (std::strncmp(p.host, mine.host, sizeof(p.host)) != 0 ||
        std::strncmp(p.boot_id, mine.boot_id, sizeof(p.boot_id)) != 0) {
      why = "rank " + std::to_string(q) + " is on another host (" + std::string(p.host) + ")";
      break;
    }
    int dev = -1;
    if (cudaDeviceGetByPCIBusId(&dev, p.bus_id) != cudaSuccess) {
      (void)cudaGetLastError();
      why = "the GPU of rank " + std::to_string(q) + " (" + p.bus_id +
            ") is not visible to this process (CUDA_VISIBLE_DEVICES differs between ranks?)";
      break;
    }
    if (dev == device) {
      // A GPU is not a peer of itself: cudaDeviceCanAccessPeer says 0 and peer access is never
      // enabled for it. CUDA IPC maps another process's allocation on the same GPU without it.
      ++peers_on_this_gpu_;
      if (same_device_) continue;
      why = "rank " + std::to_string(q) +
            " uses the same GPU as this rank (PYCOLL_CUDA_SAME_DEVICE=staged; kernels runs the CUDA engine there)";
      break;
    }
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, dev) != cudaSuccess || !can) {
      (void)cudaGetLastError();
      why = "no peer-to-peer access from GPU " + std::to_string(device) + " to the GPU of rank " + std::to_string(q);
      break;
    }
  }
  for (int q = 0; q < size && why.empty(); ++q) {
    if (q == rank) continue;
    void* ptr = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&ptr, info[q].handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      why = "cudaIpcOpenMemHandle(rank " + std::to_string(q) + ") failed: " + cudaGetErrorString(e);
      break;
    }
    peers_[q] = static_cast<char*>(ptr);
  }

  // Round 2: every rank's verdict, so that all ranks agree.
  rv.set(base + "ok/" + std::to_string(rank), why.empty() ? std::string("1") : "0" + why);
  std::vector<std::string> ok_keys;
  for (int q = 0; q < size; ++q) ok_keys.push_back(base + "ok/" + std::to_string(q));
  rv.wait_every_rank(ok_keys, timeout, "pycoll::cuda_ipc: peers' verdicts on mapping the workspaces",
                     "Every rank says whether it could map every peer's memory; the ranks named crashed, hung, "
                     "or failed while mapping.");
  reachable_ = true;
  for (int q = 0; q < size; ++q) {
    const std::string v = rv.get(ok_keys[q]);
    if (v.empty() || v[0] != '1') {
      reachable_ = false;
      if (reason_.empty())
        reason_ = "rank " + std::to_string(q) + ": " + std::string(v.begin() + (v.empty() ? 0 : 1), v.end());
    }
  }
  if (!reachable_) {
    release_mappings();
    return;
  }
  for (int q = 0; q < size; ++q) handle_.base[q] = q == rank ? local_ : peers_[q];
}

void IpcWorkspace::release_mappings() noexcept {
  for (char*& p : peers_) {
    if (p != nullptr) (void)cudaIpcCloseMemHandle(p);
    p = nullptr;
  }
  if (local_ != nullptr) (void)cudaFree(local_);
  local_ = nullptr;
  for (int q = 0; q < kMaxRanks; ++q) handle_.base[q] = nullptr;
  (void)cudaGetLastError();
}

IpcWorkspace::~IpcWorkspace() {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    release_mappings();
    if (host_err_ != nullptr) (void)cudaFreeHost(host_err_);
    host_err_ = nullptr;
    (void)cudaGetLastError();
  } catch (...) {
    // A destructor must not throw; the process is most likely shutting down.
  }
}

namespace {

// Copies the 4-byte word at `src` (pinned host memory) to each of `dsts` on a stream of its own
// and waits at most about a second for the copies: a copy engine that does not finish a 4-byte
// copy in a second will not be helped by waiting longer, and the callers must return.
void put_words(const std::vector<char*>& dsts, const uint32_t* src) {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  bool queued = false;
  for (char* d : dsts)
    queued = cudaMemcpyAsync(d, src, sizeof(uint32_t), cudaMemcpyHostToDevice, s) == cudaSuccess || queued;
  if (queued) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (cudaStreamQuery(s) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  (void)cudaGetLastError();
  (void)cudaStreamDestroy(s);  // returns at once; the stream goes when its copies are done
}

}  // namespace

void IpcWorkspace::abort() noexcept {
  if (aborted_.exchange(true) || host_err_ == nullptr || local_ == nullptr) return;
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    // The word a kernel's own error would leave (signal.cuh: raise_error): origin this rank.
    host_err_->abort_source = uint32_t(rank_ + 1) | (uint32_t(kErrPeerAborted) << 8);
    put_words({local_ + layout_.off_abort}, &host_err_->abort_source);
  } catch (...) {
    // abort() is called on the way out of a failure: never throw from it.
  }
}

void IpcWorkspace::stop_group() noexcept {
  if (group_stopped_.exchange(true) || host_err_ == nullptr || !reachable_) return;
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    // What raise_error writes into every rank's word for an error of this rank's own kernel.
    host_err_->peer_stop_word = uint32_t(rank_ + 1) | (uint32_t(kErrOpMismatch) << 8);
    std::vector<char*> words;
    for (int q = 0; q < size_; ++q) {
      char* base = q == rank_ ? local_ : peers_[q];
      if (base != nullptr) words.push_back(base + layout_.off_abort);
    }
    put_words(words, &host_err_->peer_stop_word);
  } catch (...) {
    // Called on the way out of a failure: never throw from it.
  }
}

int IpcWorkspace::error_code() const {
  if (host_err_ == nullptr) return 0;
  const int code = *reinterpret_cast<const volatile int32_t*>(&host_err_->code);
  std::atomic_thread_fence(std::memory_order_acquire);
  return code;
}

std::string IpcWorkspace::error_message() const {
  const int code = error_code();
  if (code == kErrNone) return std::string();
  const volatile HostErrorRecord* e = host_err_;
  const int op = e->op;
  const std::string what = op == 0 ? std::string("send/recv") : std::string(op_name(static_cast<OpCode>(op)));
  std::ostringstream os;
  os << "pycoll CUDA engine, rank " << e->rank << ": ";
  switch (code) {
    case kErrTimeout:
      os << what << " (CTA " << e->block << ") timed out after " << (e->waited_ns / 1000000ull)
         << " ms waiting for rank " << e->peer
         << (e->where == kWaitCredit  ? " to free a workspace slot"
             : e->where == kWaitLocal ? " (its own pushing CTA) to read the input"
                                      : " to deliver data")
         << " (flag " << e->observed << ", expected >= " << e->expected
         << "). That rank crashed, hangs, or issued a different sequence of operations.";
      break;
    case kErrPeerAborted:
      if (e->peer == e->rank && aborted()) {
        os << what << " (CTA " << e->block
           << ") stopped: this rank's process group was aborted (ProcessGroup.abort()).";
        break;
      }
      os << what << " (CTA " << e->block << ") stopped because rank " << e->peer
         << " reported an error first; see that rank's error.";
      break;
    case kErrSizeMismatch:
      os << "recv from rank " << e->peer << " expected a message of " << e->expected << " bytes but the peer sent "
         << e->observed << " bytes.";
      break;
    case kErrOpMismatch: {
      const CollectiveCheck mine = decode_check_word(e->expected);
      const CollectiveCheck theirs = decode_check_word(e->observed);
      os << "ranks called different collectives: this rank called " << describe_check(mine) << " but rank " << e->peer
         << " called " << describe_check(theirs)
         << ". Every rank must pass the same sizes, dtype, op and root, and choose the same algorithm "
         << "(PYCOLL_ALGO, set_algo()).";
      break;
    }
    default: os << "unknown device error code " << code << "."; break;
  }
  os << " The CUDA engine of this process group is unusable from now on.";
  return os.str();
}

}  // namespace cuda_ipc
}  // namespace pycoll

#endif  // PYCOLL_WITH_CUDA

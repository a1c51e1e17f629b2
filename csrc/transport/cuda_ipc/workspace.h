// Symmetric CUDA IPC workspace: one cudaMalloc per rank (layout.h), exported with CUDA IPC, the
// handles exchanged through the group's store (common/rendezvous.h), every peer's workspace mapped
// into this process; plus the host-mapped record where kernels report the first error. Hands
// kernels a DeviceHandle.
//
// Collective: every rank of the group constructs it, in the same order, with the same
// rendezvous prefix. The constructor talks to the store twice (publish / read every rank's
// handle, then publish / read every rank's verdict) so that all ranks agree on reachable().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/rendezvous.h"
#include "transport/cuda_ipc/device_handle.h"

namespace pycoll {
namespace cuda_ipc {

class IpcWorkspace {
 public:
  // `coll_slot_bytes` 0: the layout's default for `size` ranks and `coll_blocks` channels per peer
  // pair (make_layout); `regions`: the registered protocols' regions (make_layout);
  // `p2p_slot_bytes` 0: the layout's default for `size` ranks. Every rank must pass the same values
  // (the constructor throws on every rank otherwise). `same_device`: a peer on this rank's GPU (another
  // process) is mapped like any other (PYCOLL_CUDA_SAME_DEVICE=kernels); false: such a peer makes the
  // group unreachable. A rank that passes false makes every rank's reachable() false.
  IpcWorkspace(const Rendezvous& rv, int rank, int size, int device, std::chrono::milliseconds timeout,
               int64_t coll_slot_bytes = 0, int coll_blocks = kCollBlocks,
               const std::vector<ProtocolRegion>& regions = {}, int64_t p2p_slot_bytes = 0, bool same_device = false);
  ~IpcWorkspace();
  IpcWorkspace(const IpcWorkspace&) = delete;
  IpcWorkspace& operator=(const IpcWorkspace&) = delete;

  // True when every rank mapped every peer's workspace (same host; each peer on a GPU with P2P
  // access from this one, or, with `same_device`, on this GPU). The same value on every rank.
  bool reachable() const { return reachable_; }
  // Peers (other processes) that use this rank's GPU; exact when reachable().
  int peers_on_this_gpu() const { return peers_on_this_gpu_; }
  // Some two ranks of the group use one GPU (read from every rank's bus id: the same on every rank
  // of a group on one host).
  bool gpus_shared() const { return gpus_shared_; }
  // Why this rank (or some rank) found a peer unreachable; empty when reachable().
  const std::string& unreachable_reason() const { return reason_; }

  // Valid when reachable().
  const DeviceHandle& handle() const { return handle_; }
  const Layout& layout() const { return layout_; }

  // First error a kernel reported (DeviceErrorCode), 0 if none. Cheap: one read of host memory.
  int error_code() const;
  std::string error_message() const;

  // ProcessGroup.abort(): sets this rank's sticky abort word, so that a kernel waiting on a peer
  // (and every later one) ends within one poll interval and reports kErrPeerAborted with this
  // rank as the origin. Safe from any thread while kernels run: the word is copied from pinned
  // memory on a stream of its own (a copy engine, no SM needed); waits at most about a second
  // for the copy. Peers are not told (as NCCL's abort, it is local). Idempotent.
  void abort() noexcept;
  // This rank failed an op before launching its kernel (a schedule program it could not load),
  // so its peers' kernels would wait for it until the timeout: writes this rank's abort word into
  // every rank's workspace, its own too, as a kernel's own error does (signal.cuh: raise_error);
  // every wait, now or later, ends within one poll interval with kErrPeerAborted naming this rank
  // (the waits read the rank from the word). Bounded as abort() is. Idempotent.
  void stop_group() noexcept;
  bool aborted() const { return aborted_.load(); }

 private:
  void init(const Rendezvous& rv, std::chrono::milliseconds timeout, int64_t coll_slot_bytes, int coll_blocks,
            const std::vector<ProtocolRegion>& regions, int64_t p2p_slot_bytes);
  void release_mappings() noexcept;

  int rank_;
  int size_;
  int device_;
  bool same_device_;
  int peers_on_this_gpu_ = 0;
  bool gpus_shared_ = false;
  bool reachable_ = false;
  std::string reason_;
  Layout layout_;
  char* local_ = nullptr;                // this rank's workspace (cudaMalloc)
  std::vector<char*> peers_;             // peers' workspaces, opened with cudaIpcOpenMemHandle
  HostErrorRecord* host_err_ = nullptr;  // cudaHostAlloc(mapped)
  std::atomic<bool> aborted_{false};
  std::atomic<bool> group_stopped_{false};
  DeviceHandle handle_;
};

}  // namespace cuda_ipc
}  // namespace pycoll

// Collectives between ranks (processes) that all share one GPU, with no kernel that waits on a flag
// another process writes (PYCOLL_CUDA_SAME_DEVICE=events). Without the MPS daemon the kernels of
// different processes time-slice, so a kernel spinning on a peer's flag holds the GPU while the
// writer cannot run; here the hosts meet in shared memory and the streams are ordered across the
// processes with CUDA IPC events (docs/decisions/0039-ipc-event-handoff.md).
//
// Each rank has a staging buffer W_r in device memory that every peer maps (CUDA IPC), and two
// interprocess events: R_r (W_r holds this round's input) and D_r (this rank has finished reading
// the peers' W). One round of a collective, on rank r and the caller's stream s:
//   (a) host: wait until every peer has issued round k-1 (done counters in shared memory);
//   (b) s waits on every D_q (the peers no longer read W_r);  (c) copy the input into W_r;
//   (d) record R_r, publish ready_r = k;  (e) host: wait until every ready_q >= k;
//   (f) s waits on every R_q;  (g) one kernel or copy reads the peers' W_q and writes the output;
//   (h) record D_r, publish done_r = k.
// Messages larger than W are cut into rounds. The host waits only for the peers' hosts to issue
// work, never for the GPU; they end with GroupBroken on timeout, a dead peer or abort().
//
// Contract: every rank of the group constructs it (collective, same order) and issues the same ops
// in the same order from one thread; buffers are dense device memory on `device`; `device` is the
// current device of the calling thread (the engine guards it). Not usable under CUDA graph capture.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "common/rendezvous.h"
#include "common/types.h"
#include "transport/shm/shm_segment.h"

namespace pycoll {

class SameDevicePath {
 public:
  static constexpr int64_t kDefaultStagingBytes = int64_t(64) << 20;

  // Collective. `staging_bytes` (W's size, rounded down to 4 KiB, at least 4 KiB) must be equal on
  // every rank: the ranks compare it. `timeout` bounds every host wait (the group's timeout).
  SameDevicePath(const Rendezvous& rv, int rank, int size, int device, std::chrono::milliseconds timeout,
                 int64_t staging_bytes = kDefaultStagingBytes);
  ~SameDevicePath();
  SameDevicePath(const SameDevicePath&) = delete;
  SameDevicePath& operator=(const SameDevicePath&) = delete;

  // `t` is a dtype the CUDA engine reduces (engines/dtypes.h: cuda_kernels_reduce); `op` any of
  // Sum, Avg, Product, Min, Max, BAnd, BOr, BXor (Bool: Sum/Max = OR, Product/Min = AND). Every rank
  // reduces in rank order 0..size-1, so the results are bitwise identical. `in` may be `out`.
  Algo all_reduce(const void* in, void* out, int64_t count, DType t, ReduceKind op, cudaStream_t s);
  // `in`: size * m elements; `out`: m (this rank's block of the reduction).
  void reduce_scatter(const void* in, void* out, int64_t m, DType t, ReduceKind op, cudaStream_t s);
  // `out`: size * bytes, rank q's `in` at q * bytes.
  void all_gather(const void* in, void* out, int64_t bytes, cudaStream_t s);
  void broadcast(void* buf, int64_t bytes, int root, cudaStream_t s);
  // Collective: `ops` all_reduces of one float on a stream of its own after one to warm up; returns
  // this rank's mean time per op in microseconds, host issue to completion. What one op costs at
  // any size below a round's copy time: about two context switches without the MPS daemon (a
  // few hundred us), tens of us with it (docs/decisions/0039-ipc-event-handoff.md).
  double time_small_all_reduce_us(int ops);
  // Any thread: the host waits of this rank (now and later) end with an error at once, and so do
  // the peers' (the flag is shared). GPU work already enqueued is left to run.
  void abort() noexcept;

  int64_t staging_bytes() const { return staging_; }
  // Why the group cannot go on (the first failure of this rank's rounds), or empty.
  const std::string& broken() const { return broken_; }

 private:
  struct Shared;  // the shared-memory counters
  struct Round;   // what one round does (same_device_path.cu)

  void run_round(const Round& rd, cudaStream_t s);
  void check_usable(const char* op, cudaStream_t s);
  void wait_peers(bool done_counter, int64_t target, const char* op, const char* stage);
  [[noreturn]] void fail(const std::string& why);
  bool peer_alive(int q) const;
  void release() noexcept;

  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  int64_t staging_ = 0;
  int max_blocks_ = 1;  // CTAs of one kernel: twice the SMs
  int64_t round_ = 0;   // rounds issued so far (all ops together)
  std::string broken_;  // set by the first failure: later ops raise it at once
  std::atomic<bool> aborted_{false};

  ShmSegment shm_;
  Shared* sh_ = nullptr;
  std::string shm_name_;
  std::vector<int> pids_;
  std::vector<bool> check_pid_;  // false for a peer in another pid namespace (only the timeout applies)

  void* mine_ = nullptr;                         // W_r, cudaMalloc'd
  std::vector<void*> staging_of_;                // W_q as mapped here (mine_ for q == rank)
  std::vector<cudaEvent_t> ready_ev_, done_ev_;  // R_q, D_q (this rank's own, or opened from the peers)
};

}  // namespace pycoll

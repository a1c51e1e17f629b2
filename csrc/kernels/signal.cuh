// Flags between GPUs: the few memory-ordering verbs the kernels use, the bounded spin-wait and the
// error path. No torch here.
//
// Ordering contract (PTX memory model, system scope because the peer is another GPU):
//   writer: every thread of the CTA stores its data (to a peer's memory or its own), then
//           __syncthreads(), then ONE thread does st_release_sys(flag, v).
//   reader: ONE thread loops on ld_acquire_sys(flag) until it sees >= v, then __syncthreads(),
//           then every thread of the CTA may read the data.
// bar.sync orders the other threads' accesses before the releasing thread's store (and after the
// acquiring thread's load) in causality order; release/acquire at .sys scope carries that order
// across the NVLink/PCIe boundary. This is the pattern of vLLM's custom all-reduce barrier and of
// NCCL's Simple protocol. The same pair also orders reads before a later overwrite (a consumer's
// reads of a slot happen before its release of `head`, which the producer acquires before it
// reuses the slot).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "transport/cuda_ipc/device_handle.h"

namespace pycoll {
namespace kernels {

using cuda_ipc::DeviceHandle;
using cuda_ipc::HostErrorRecord;

// Nanoseconds since an arbitrary origin (resolution about 1 us on Hopper).
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Release store: this thread's earlier memory accesses (and those ordered before it by a
// __syncthreads) become visible to any thread, on any GPU or the host, that reads `v` with an
// acquire load at system scope.
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Acquire load: accesses after it (in this thread, and after a __syncthreads in the CTA) see
// everything the releasing writer made visible.
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Relaxed (no ordering) system-scope accesses: used for the sticky abort word only.
__device__ __forceinline__ uint32_t ld_relaxed_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Where a wait happens, for the error report.
struct WaitSite {
  int32_t op;
  int32_t block;
  int32_t peer;
  int32_t where;
};

// Records the first error of this rank in host-mapped memory and stops everything: sets this
// rank's sticky abort word (other CTAs and later kernels then fail fast) and, unless the error is
// itself a peer's abort, the abort word of every peer. Only the first caller on a rank reports.
static __device__ __noinline__ void raise_error(const DeviceHandle* h, int32_t code, const WaitSite& site,
                                         uint64_t expected, uint64_t observed, uint64_t waited_ns) {
  char* mine = h->base[h->rank];
  uint32_t* claim = reinterpret_cast<uint32_t*>(mine + h->layout.off_claim);
  if (atomicCAS(claim, 0u, 1u) != 0u) return;  // this rank already reported
  volatile HostErrorRecord* e = h->err;
  e->rank = h->rank;
  e->peer = site.peer;
  e->block = site.block;
  e->op = site.op;
  e->where = site.where;
  e->expected = expected;
  e->observed = observed;
  e->waited_ns = waited_ns;
  __threadfence_system();
  e->code = code;
  __threadfence_system();
  const uint32_t word = uint32_t(h->rank + 1) | (uint32_t(code) << 8);
  st_relaxed_sys(reinterpret_cast<uint32_t*>(mine + h->layout.off_abort), word);
  if (code != cuda_ipc::kErrPeerAborted) {
    for (int q = 0; q < h->nranks; ++q) {
      if (q == h->rank || h->base[q] == nullptr) continue;
      st_relaxed_sys(reinterpret_cast<uint32_t*>(h->base[q] + h->layout.off_abort), word);
    }
  }
  __threadfence_system();
}

static __device__ __noinline__ bool wait_ge_slow(const DeviceHandle* h, const uint64_t* flag,
                                          uint64_t target, WaitSite site) {
  const uint32_t* abort_word =
      reinterpret_cast<const uint32_t*>(h->base[h->rank] + h->layout.off_abort);
  const uint64_t start = globaltimer_ns();
  for (uint32_t spin = 1;; ++spin) {
    const uint64_t v = ld_acquire_sys(flag);
    if (v >= target) return true;
    if ((spin & 127u) == 0u) {
      const uint32_t ab = ld_relaxed_sys(abort_word);
      const uint64_t now = globaltimer_ns();
      if (ab != 0u) {
        site.peer = int32_t(ab & 0xffu) - 1;
        raise_error(h, cuda_ipc::kErrPeerAborted, site, target, v, now - start);
        return false;
      }
      if (now - start > h->timeout_ns) {
        raise_error(h, cuda_ipc::kErrTimeout, site, target, v, now - start);
        return false;
      }
    }
  }
}

// Bounded spin-wait until *flag >= target, with acquire semantics on success. Returns false (and
// the error is already reported) when the engine's timeout expires or when this rank has been
// aborted. Called by one thread per flag.
__device__ __forceinline__ bool wait_ge(const DeviceHandle* h, const uint64_t* flag,
                                        uint64_t target, const WaitSite& site) {
  if (ld_acquire_sys(flag) >= target) return true;
  return wait_ge_slow(h, flag, target, site);
}

}  // namespace kernels
}  // namespace pycoll

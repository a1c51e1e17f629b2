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

// The same pair at GPU scope, for flags between CTAs of one GPU (the split one-shot's progress).
__device__ __forceinline__ void st_release_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_acquire_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// ... and on 32-bit words (the claimed split's per-chunk ready flags).
__device__ __forceinline__ void st_release_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_gpu_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
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

// ---- LL lines (cuda/kernels/ll_all_reduce.cuh) ---------------------------------------------------

// One 16-byte volatile load of an LL line (never served from L1): payload halves and their flags.
struct LLRaw {
  uint32_t d0, f0, d1, f1;
};
__device__ __forceinline__ LLRaw ll_load(const void* line) {
  LLRaw r;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.d0), "=r"(r.f0), "=r"(r.d1), "=r"(r.f1)
               : "l"(line)
               : "memory");
  return r;
}

// The flag of LL epoch `epoch` (>= 1): 1..2^32-1, never 0 (the workspace's initial value).
__device__ __forceinline__ uint32_t ll_flag(uint64_t epoch) { return uint32_t((epoch - 1) % 0xffffffffull) + 1u; }

// True when `peer` has started the LL all_reduce that would follow this rank's LL calls so far (its
// CTA 0 header for this rank's next epoch is here); *check gets that call's check word. A rank
// stuck in a channel wait on `peer` uses it: a peer that has moved on to a later call has sent
// everything of this one, so the wait can only end by a mismatch.
__device__ __forceinline__ bool peer_in_next_ll_call(const DeviceHandle* h, int peer, uint64_t* check) {
  const cuda_ipc::LLLayout& L = h->layout.ll;
  const char* mine = h->base[h->rank];
  const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(mine + L.epoch_offset(0)) + 1;
  const uint32_t flag = ll_flag(epoch);
  const LLRaw r = ll_load(mine + L.line_offset(h->nranks, peer, h->rank, int(epoch & 1), 0, 0));
  *check = uint64_t(r.d0) | (uint64_t(r.d1) << 32);
  return r.f0 == flag && r.f1 == flag;
}

// The same for the registered protocols with a probe (cuda_ipc::RegionProbe, e.g. the LL128
// two-shot): `peer`'s header for this rank's next call of one of them is here (its flag word is
// that call's count, the check word its first word).
__device__ __forceinline__ bool peer_in_next_region_call(const DeviceHandle* h, int peer, uint64_t* check) {
  const char* mine = h->base[h->rank];
  const int pidx = (peer - h->rank - 1 + 2 * h->nranks) % h->nranks;
  for (int i = 0; i < h->layout.nregions && i < cuda_ipc::kMaxProtocolRegions; ++i) {
    const cuda_ipc::RegionProbe& P = h->layout.regions[i].probe;
    if (P.header_stride == 0) continue;
    const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(mine + P.epoch_off) + 1;
    const char* header = mine + P.header_off + int64_t(pidx) * P.header_stride;
    if (*reinterpret_cast<const volatile uint64_t*>(header + P.flag_byte) != epoch) continue;
    *check = *reinterpret_cast<const volatile uint64_t*>(header);
    return true;
  }
  return false;
}

// A collective's channel wait gives a peer that is already in its next LL call this long to make
// the awaited flag visible before the ranks are declared mismatched.
constexpr uint64_t kLLMismatchGraceNs = 1000000;

// Called every 128 polls of a bounded wait that started at `start`: false (and the error
// reported, with `expected` and `observed` for the record) once this rank has been aborted or the
// engine's timeout has expired. Every spin-wait of the kernels ends through here.
static __device__ __noinline__ bool keep_waiting(const DeviceHandle* h, uint64_t start, WaitSite site,
                                                 uint64_t expected, uint64_t observed) {
  const uint32_t ab = ld_relaxed_sys(reinterpret_cast<const uint32_t*>(h->base[h->rank] + h->layout.off_abort));
  const uint64_t now = globaltimer_ns();
  if (ab != 0u) {
    site.peer = int32_t(ab & 0xffu) - 1;
    raise_error(h, cuda_ipc::kErrPeerAborted, site, expected, observed, now - start);
    return false;
  }
  if (now - start > h->timeout_ns) {
    raise_error(h, cuda_ipc::kErrTimeout, site, expected, observed, now - start);
    return false;
  }
  return true;
}

// `check`: this rank's check word (collectives; 0 for send/recv, which skip the LL probe).
static __device__ __noinline__ bool wait_ge_slow(const DeviceHandle* h, const uint64_t* flag, uint64_t target,
                                                 WaitSite site, uint64_t check) {
  const uint64_t start = globaltimer_ns();
  uint64_t peer_moved_on_at = 0;
  for (uint32_t spin = 1;; ++spin) {
    const uint64_t v = ld_acquire_sys(flag);
    if (v >= target) return true;
    if ((spin & 127u) == 0u) {
      if (!keep_waiting(h, start, site, target, v)) return false;
      uint64_t theirs = 0;
      if (site.op != 0 &&
          (peer_in_next_ll_call(h, site.peer, &theirs) || peer_in_next_region_call(h, site.peer, &theirs))) {
        const uint64_t now = globaltimer_ns();
        if (peer_moved_on_at == 0) peer_moved_on_at = now;
        if (now - peer_moved_on_at > kLLMismatchGraceNs) {
          raise_error(h, cuda_ipc::kErrOpMismatch, site, check, theirs, now - start);
          return false;
        }
      }
    }
  }
}

// Bounded spin-wait until *flag >= target, with acquire semantics on success. Returns false (and
// the error is already reported) when the engine's timeout expires, when this rank has been
// aborted, or (collectives) when the awaited peer has moved on to an LL all_reduce or a registered
// protocol's. Called by one thread per flag.
__device__ __forceinline__ bool wait_ge(const DeviceHandle* h, const uint64_t* flag, uint64_t target,
                                        const WaitSite& site, uint64_t check) {
  if (ld_acquire_sys(flag) >= target) return true;
  return wait_ge_slow(h, flag, target, site, check);
}

// Bounded spin-wait until *flag >= target for a flag another CTA of this GPU writes (acquire at
// GPU scope). Same exits as wait_ge, without the LL probe (no peer is involved).
static __device__ __noinline__ bool wait_local_ge(const DeviceHandle* h, const uint64_t* flag, uint64_t target,
                                                  WaitSite site) {
  if (ld_acquire_gpu(flag) >= target) return true;
  const uint64_t start = globaltimer_ns();
  for (uint32_t spin = 1;; ++spin) {
    const uint64_t v = ld_acquire_gpu(flag);
    if (v >= target) return true;
    if ((spin & 127u) == 0u && !keep_waiting(h, start, site, target, v)) return false;
  }
}

}  // namespace kernels
}  // namespace pycoll

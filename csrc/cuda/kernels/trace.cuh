// PYCOLL_CUDA_TRACE=1: a kernel stamps %globaltimer at the points of its timeline into its slot of
// the host-mapped trace ring (DeviceHandle::trace; transport/cuda_ipc/layout.h: trace_index), one
// row per CTA, so that where the time of a collective goes is measured rather than guessed. The
// host reads the last traced kernels without synchronizing (CudaEngine::traced_kernels: the
// flight recorder's dumps), or the newest after a synchronize (ProcessGroupPycoll.cuda_trace()).
// Off, a mark is one predictable branch.
//
// Every all_reduce (channel protocol, LL, LL128) and every send and receive stamps 0 (start, after
// the wait for the previous kernel) and 1 (end); two-shot (cuda/kernels/two_shot.cuh) stamps 2, 3, ... after each acquire and each step, and
// with waves kTraceEvents-2 when a leader posted its wave / a follower saw its leader's post.
// Events of the split one-shot all_reduce (cuda/kernels/one_shot.cuh, one_shot_claimed.cuh), per CTA:
//   0 kernel start; 1 kernel end; 2+2k / 3+2k: pusher: chunk k stored by the data warps / chunk k
//   published (after its fence); reducer: chunk k arrived from every peer / chunk k reduced and
//   released. Event kTraceEvents-1: the number of chunks of the CTA's channel.
#pragma once

#include <cstdint>

#include "cuda/kernels/signal.cuh"

namespace pycoll {
namespace kernels {

__device__ __forceinline__ void trace_mark(const DeviceHandle* h, bool on, int cta, int e, uint64_t value) {
  if (on && h->trace != nullptr && e >= 0 && e < cuda_ipc::kTraceEvents && cta < cuda_ipc::kTraceCtas) {
    *reinterpret_cast<volatile uint64_t*>(h->trace + cuda_ipc::trace_index(cta, e)) = value;
    // The start names the row's launch: the host keeps only rows of the launch a slot now holds.
    if (e == 0) *reinterpret_cast<volatile uint64_t*>(h->trace + cuda_ipc::trace_launch_index(cta)) = h->trace_launch;
  }
}
__device__ __forceinline__ void trace_now(const DeviceHandle* h, bool on, int cta, int e) {
  if (on) trace_mark(h, on, cta, e, globaltimer_ns());
}

}  // namespace kernels
}  // namespace pycoll

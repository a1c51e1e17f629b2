// Programmatic dependent launch (sm_90 and later). The host may launch a collective kernel with
// cudaLaunchAttributeProgrammaticStreamSerialization (cuda/launch.cu): the GPU then schedules its
// CTAs before the kernel ahead of it on the stream has finished, instead of only after that
// kernel's end and memory flush: about 1 us less per call for small and medium collectives
// replayed in a CUDA graph (docs/decisions/0005-early-launch.md).
//
// The contract every kernel launched that way keeps: nothing but its own arguments is read or
// written before wait_for_previous_grid(), which returns once every earlier kernel on the stream
// has completed and its memory is visible. Without the attribute both calls are no-ops.
#pragma once

namespace pycoll {
namespace kernels {

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel's CTAs be scheduled (they wait in wait_for_previous_grid). Called once this
// kernel's CTAs run: only then are all of them resident, so early CTAs of the next kernel can take
// only SMs this kernel does not need (every CTA of a collective must be resident at once).
__device__ __forceinline__ void let_next_grid_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace kernels
}  // namespace pycoll

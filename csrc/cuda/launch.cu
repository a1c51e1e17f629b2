// Compiles the kernels and launches them. Kept apart from the torch glue so that this file
// includes only CUDA headers.
#include "cuda/launch.h"

#include "kernels/entry.cuh"

namespace pycoll {
namespace gpu {

cudaError_t launch_reduce(int grid, cudaStream_t stream, const kernels::ReduceArgs& a) {
  kernels::reduce_kernel<<<grid, kernels::kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_copy(int grid, cudaStream_t stream, const kernels::CopyArgs& a) {
  kernels::copy_kernel<<<grid, kernels::kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_p2p(int grid, cudaStream_t stream, const kernels::P2PArgs& a) {
  kernels::p2p_kernel<<<grid, kernels::kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace pycoll

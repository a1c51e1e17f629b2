// Compiles the kernels and launches them. Kept apart from the torch glue so that this file
// includes only CUDA headers.
#include "cuda/launch.h"
#include "cuda/all_reduce_registry.h"
#include "cuda/launch_config.h"

#include "kernels/entry.cuh"

namespace pycoll {
namespace gpu {

cudaError_t launch_reduce(int grid, cudaStream_t stream, const kernels::ReduceArgs& a, bool early) {
  return launch_kernel(kernels::reduce_kernel, grid, kernels::kThreads, stream, a, early);
}

cudaError_t launch_copy(int grid, cudaStream_t stream, const kernels::CopyArgs& a, bool early) {
  return launch_kernel(kernels::copy_kernel, grid, kernels::kThreads, stream, a, early);
}

cudaError_t launch_p2p(int grid, cudaStream_t stream, const kernels::P2PArgs& a, bool early) {
  return launch_kernel(kernels::p2p_kernel, grid, kernels::kThreads, stream, a, early);
}

cudaError_t launch_p2p_batch(int grid, cudaStream_t stream, const kernels::P2PBatchArgs& a) {
  return launch_kernel(kernels::p2p_batch_kernel, grid, kernels::kThreads, stream, a, /*early=*/false);
}

bool kernels_support_early_launch() {
  return compiled_with_grid_dependency(kernels::reduce_kernel) && compiled_with_grid_dependency(kernels::copy_kernel) &&
         compiled_with_grid_dependency(kernels::p2p_kernel) && ll_kernels_support_early_launch() &&
         registered_launchers_support_early_launch();
}

}  // namespace gpu
}  // namespace pycoll

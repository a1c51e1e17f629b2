// Compiles the kernels and launches them. Kept apart from the torch glue so that this file
// includes only CUDA headers.
#include "cuda/launch.h"
#include "cuda/all_reduce_registry.h"
#include "cuda/launch_config.h"

#include "cuda/kernels/entry.cuh"

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

namespace {
// Reads the GPU's clock into host-mapped memory (gpu::launch_read_globaltimer).
__global__ void read_globaltimer_kernel(uint64_t* out) {
  *reinterpret_cast<volatile uint64_t*>(out) = kernels::globaltimer_ns();
}
}  // namespace

cudaError_t launch_read_globaltimer(uint64_t* out, cudaStream_t stream) {
  read_globaltimer_kernel<<<1, 1, 0, stream>>>(out);
  return cudaGetLastError();
}

bool kernels_support_early_launch() {
  return compiled_with_grid_dependency(kernels::reduce_kernel) && compiled_with_grid_dependency(kernels::copy_kernel) &&
         compiled_with_grid_dependency(kernels::p2p_kernel) && registered_launchers_support_early_launch();
}

namespace {

// The channel protocol's all_reduce (cuda/channel_all_reduce.cpp) runs in the reduce kernel.
int launch_channel_all_reduce(int grid, void* stream, const kernels::ReduceArgs& a, bool early) {
  return int(launch_reduce(grid, static_cast<cudaStream_t>(stream), a, early));
}

bool channel_supports_early_launch() { return compiled_with_grid_dependency(kernels::reduce_kernel); }

[[maybe_unused]] const bool kRegistered =
    register_all_reduce_launcher(kChannelProtocolName, {&launch_channel_all_reduce, &channel_supports_early_launch});

}  // namespace

}  // namespace gpu
}  // namespace pycoll

// Kernel launchers. No torch here; the host engine (cuda_engine.cu) calls these after planning a
// launch. Each returns the launch's cudaGetLastError() for the caller to check.
//
// `early`: launch with programmatic stream serialization, so that the kernel's CTAs may be
// scheduled while the kernel before it on the stream finishes (cuda/kernels/grid_dependency.cuh; sm_90
// and later, PYCOLL_CUDA_EARLY_LAUNCH).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/kernels/args.h"

namespace pycoll {
namespace gpu {

// `grid` CTAs of kernels::kThreads threads on `stream`.
cudaError_t launch_reduce(int grid, cudaStream_t stream, const kernels::ReduceArgs& args, bool early);
cudaError_t launch_copy(int grid, cudaStream_t stream, const kernels::CopyArgs& args, bool early);
cudaError_t launch_p2p(int grid, cudaStream_t stream, const kernels::P2PArgs& args, bool early);
// A coalesced batch of sends and receives (never early: see CudaEngine::send).
cudaError_t launch_p2p_batch(int grid, cudaStream_t stream, const kernels::P2PBatchArgs& args);
// all_reduce launches through the registry of its protocols (cuda/all_reduce_registry.h).
// One thread writes the GPU's %globaltimer (ns) to `out` (device-visible, e.g. host-mapped).
cudaError_t launch_read_globaltimer(uint64_t* out, cudaStream_t stream);

// Whether the kernels (the registered protocols' too) were compiled with their grid-dependency
// waits (PTX for sm_90 or later); without them `early` must stay false.
bool kernels_support_early_launch();

}  // namespace gpu
}  // namespace pycoll

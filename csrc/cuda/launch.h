// Kernel launchers: the dtype/op switch that picks a kernel instantiation. No torch here; the
// host engine (cuda_engine.cu) calls these after planning a launch.
#pragma once

#include <cuda_runtime_api.h>

#include "common/types.h"
#include "kernels/args.h"

namespace pycoll {
namespace gpu {

// Reduce ops the kernels implement. Avg, Bool and Int8 bitwise ops are mapped onto these by the
// engine (see cuda_engine.cu: kernel_op).
enum class KOp : int32_t { Sum = 0, Prod = 1, Min = 2, Max = 3, And = 4, Or = 5, Xor = 6 };

// Launch on `stream` with `grid` CTAs of kernels::kThreads threads. Return the launch's
// cudaGetLastError() (the caller checks it). `dtype` must not be Bool; bitwise ops only for
// UInt8, Int32, Int64.
cudaError_t launch_reduce(DType dtype, KOp op, int grid, cudaStream_t stream, const kernels::ReduceArgs& args);
cudaError_t launch_copy(int grid, cudaStream_t stream, const kernels::CopyArgs& args);
cudaError_t launch_p2p(int grid, cudaStream_t stream, const kernels::P2PArgs& args);

}  // namespace gpu
}  // namespace pycoll

// Compiles the LL all-reduce kernels (one per dtype and reduce op, cuda/reduce_kernel_table.h) and
// launches them. A file of its own so that it compiles in parallel with launch.cu.
#include "cuda/launch.h"
#include "cuda/launch_config.h"
#include "cuda/reduce_kernel_table.h"

#include "kernels/ll_all_reduce.cuh"

namespace pycoll {
namespace gpu {

namespace {

struct LLKernels {
  using Fn = void (*)(kernels::ReduceArgs);
  template <DType D, class Op>
  static Fn get() {
    return kernels::ll_all_reduce_kernel<D, Op>;
  }
};

}  // namespace

cudaError_t launch_ll_all_reduce(int grid, cudaStream_t stream, const kernels::ReduceArgs& a, bool early) {
  const LLKernels::Fn k = reduce_kernel_for<LLKernels>(a.dtype, a.rop);
  if (k == nullptr) return cudaErrorInvalidValue;  // the host maps every valid pair (cuda_engine.cu)
  return launch_kernel(k, grid, kernels::kLLThreads, stream, a, early);
}

bool ll_kernels_support_early_launch() {
  return compiled_with_grid_dependency(kernels::ll_all_reduce_kernel<DType::Float32, kernels::OpSum>);
}

}  // namespace gpu
}  // namespace pycoll

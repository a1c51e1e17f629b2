// Compiles the LL128 two-shot all-reduce kernels (one per dtype and reduce op,
// cuda/reduce_kernel_table.h) and launches them. A file of its own so that it compiles in parallel
// with launch.cu and launch_ll.cu.
#include "cuda/launch.h"
#include "cuda/launch_config.h"
#include "cuda/reduce_kernel_table.h"

#include "kernels/ll128_two_shot.cuh"

namespace pycoll {
namespace gpu {

namespace {

struct LL128Kernels {
  using Fn = void (*)(kernels::ReduceArgs);
  template <DType D, class Op>
  static Fn get() {
    return kernels::ll128_two_shot_kernel<D, Op>;
  }
};

}  // namespace

cudaError_t launch_ll128_two_shot(int grid, cudaStream_t stream, const kernels::ReduceArgs& a, bool early) {
  const LL128Kernels::Fn k = reduce_kernel_for<LL128Kernels>(a.dtype, a.rop);
  if (k == nullptr) return cudaErrorInvalidValue;  // the host maps every valid pair (cuda_engine.cu)
  return launch_kernel(k, grid, kernels::kLL128Threads, stream, a, early);
}

bool ll128_kernels_support_early_launch() {
  return compiled_with_grid_dependency(kernels::ll128_two_shot_kernel<DType::Float32, kernels::OpSum>);
}

}  // namespace gpu
}  // namespace pycoll

// Compiles the LL one-shot all-reduce kernels (one per dtype and reduce op,
// cuda/reduce_kernel_table.h) and registers their launcher with the all_reduce registry (the
// protocol itself: cuda/ll_all_reduce.cpp). A file of its own so that it compiles in parallel with
// launch.cu.
#include "cuda/all_reduce_registry.h"
#include "cuda/launch_config.h"
#include "cuda/reduce_kernel_table.h"

#include "cuda/kernels/ll_all_reduce.cuh"

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

// `grid` = the message's 16 KiB regions, one CTA each.
int launch(int grid, void* stream, const kernels::ReduceArgs& a, bool early) {
  const LLKernels::Fn k = reduce_kernel_for<LLKernels>(a.dtype, a.rop);
  if (k == nullptr) return int(cudaErrorInvalidValue);  // the host maps every valid pair (cuda_engine.cu)
  return int(launch_kernel(k, grid, kernels::kLLThreads, static_cast<cudaStream_t>(stream), a, early));
}

bool supports_early_launch() {
  return compiled_with_grid_dependency(kernels::ll_all_reduce_kernel<DType::Float32, kernels::OpSum>);
}

[[maybe_unused]] const bool kRegistered =
    register_all_reduce_launcher(kLLProtocolName, {&launch, &supports_early_launch});

}  // namespace

}  // namespace gpu
}  // namespace pycoll

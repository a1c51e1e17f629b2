// Compiles the LL128 two-shot all-reduce kernels (one per dtype and reduce op,
// cuda/reduce_kernel_table.h) and registers their launcher with the all_reduce registry (the
// protocol itself: cuda/ll128_two_shot.cpp). A file of its own so that it compiles in parallel
// with launch.cu and launch_ll.cu.
#include "cuda/all_reduce_registry.h"
#include "cuda/launch_config.h"
#include "cuda/reduce_kernel_table.h"

#include "cuda/kernels/ll128_two_shot.cuh"

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

// CTA b takes the b-th of `grid` equal ranges of every segment's 120-byte lines.
int launch(int grid, void* stream, const kernels::ReduceArgs& a, bool early) {
  const LL128Kernels::Fn k = reduce_kernel_for<LL128Kernels>(a.dtype, a.rop);
  if (k == nullptr) return int(cudaErrorInvalidValue);  // the host maps every valid pair (cuda_engine.cu)
  return int(launch_kernel(k, grid, kernels::kLL128Threads, static_cast<cudaStream_t>(stream), a, early));
}

bool supports_early_launch() {
  return compiled_with_grid_dependency(kernels::ll128_two_shot_kernel<DType::Float32, kernels::OpSum>);
}

[[maybe_unused]] const bool kRegistered =
    register_all_reduce_launcher(cuda_ipc::kLL128ProtocolName, {&launch, &supports_early_launch});

}  // namespace

}  // namespace gpu
}  // namespace pycoll

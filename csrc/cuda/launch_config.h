// One kernel launch through cudaLaunchKernelEx, optionally with programmatic stream serialization
// (cuda/kernels/grid_dependency.cuh). Included by the .cu files that launch the collective kernels.
#pragma once

#include <cuda_runtime.h>

namespace pycoll {
namespace gpu {

template <class Args>
cudaError_t launch_kernel(void (*kernel)(Args), int grid, int threads, cudaStream_t stream, const Args& args,
                          bool early) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = early ? &attr : nullptr;
  cfg.numAttrs = early ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, args);
  const cudaError_t last = cudaGetLastError();  // clears the runtime's last error either way
  return err != cudaSuccess ? err : last;
}

// True when `kernel` was compiled from PTX for sm_90 or later, i.e. its griddepcontrol
// instructions exist (cuda/kernels/grid_dependency.cuh); a build for older targets JIT-compiled on a
// newer GPU has none, and must not be launched early.
template <class Args>
bool compiled_with_grid_dependency(void (*kernel)(Args)) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.ptxVersion >= 90;
}

}  // namespace gpu
}  // namespace pycoll

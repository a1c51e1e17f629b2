// One kernel launch through cudaLaunchKernelEx, optionally with programmatic stream serialization
// (kernels/grid_dependency.cuh). Included by the .cu files that launch the collective kernels.
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
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace gpu
}  // namespace pycoll

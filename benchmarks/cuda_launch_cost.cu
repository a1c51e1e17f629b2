// The host cost of one kernel launch, the floor under every eager CUDA collective: an empty kernel
// with a 256-byte argument struct, launched back to
// back with <<<>>>, with cudaLaunchKernelEx, and with cudaLaunchKernelEx and the programmatic
// dependent launch attribute that pycoll's collective kernels set (csrc/cuda/launch_config.h); 1 and 64
// CTAs; host time per launch, best of 5 runs of 20,000. One GPU is enough.
//
//   nvcc -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 benchmarks/cuda_launch_cost.cu -o /tmp/launch_cost
//   /tmp/launch_cost
//
// On an H200 host (2026-11-28): 3.5-3.8 us with <<<>>> or cudaLaunchKernelEx, 2.9-3.0 us with the
// attribute (docs/performance.md).
#include <cstdio>
#include <chrono>
#include <cuda_runtime.h>
struct Args { char pad[256]; };
__global__ void k(Args a) { if (a.pad[0] == 42 && threadIdx.x == 9999) printf("x"); }
int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  Args a{}; const int N = 200000;
  for (int blocks : {1, 64}) {
    for (int mode = 0; mode < 3; ++mode) {
      cudaLaunchConfig_t cfg{}; cfg.gridDim = blocks; cfg.blockDim = 256; cfg.stream = s;
      cudaLaunchAttribute attr[1]; attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = mode == 2 ? attr : nullptr; cfg.numAttrs = mode == 2 ? 1 : 0;
      double best = 1e9;
      for (int rep = 0; rep < 5; ++rep) {
        cudaStreamSynchronize(s);
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < N / 10; ++i) {
          if (mode == 0) k<<<blocks, 256, 0, s>>>(a);
          else cudaLaunchKernelEx(&cfg, k, a);
        }
        auto t1 = std::chrono::steady_clock::now();
        cudaStreamSynchronize(s);
        best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count() / (N / 10));
      }
      printf("blocks=%d %s: %.2f us per launch (host, best of 5)\n", blocks,
             mode == 0 ? "<<<>>>" : mode == 1 ? "cudaLaunchKernelEx" : "cudaLaunchKernelEx+PDL", best);
    }
  }
  printf("err=%s\n", cudaGetErrorString(cudaGetLastError()));
}

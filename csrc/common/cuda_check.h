// Checks a CUDA runtime call and raises (c10::Error, a RuntimeError in Python) with the caller's
// words and CUDA's reason: PYCOLL_CUDA_CHECK(cudaEventRecord(e, s), "pycoll::all_reduce: ",
// "cudaEventRecord"). Host code of CUDA builds only.
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#define PYCOLL_CUDA_CHECK(expr, ...)                                                                    \
  do {                                                                                                  \
    const cudaError_t pycoll_err_ = (expr);                                                             \
    TORCH_CHECK(pycoll_err_ == cudaSuccess, __VA_ARGS__, " failed: ", cudaGetErrorString(pycoll_err_)); \
  } while (0)

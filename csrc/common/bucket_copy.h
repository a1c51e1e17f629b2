// The copies of flatten_into / unflatten_from, the same for CPU and CUDA tensors: each contiguous
// tensor becomes a piece of a batched copy plan (common/batched_copy.h) that the caller runs (one
// parallel loop on CPU, one kernel on CUDA); a tensor that is not contiguous is copied here, by
// torch, before the plan runs. Plain C++ with ATen, compiled into .cpp and .cu files alike.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "common/batched_copy.h"

namespace pycoll {

enum class BucketCopy {
  Flatten,    // tensors[i] (all of bucket's dtype) one after another into the contiguous bucket, from element 0
  Unflatten,  // the inverse: the bucket's elements back into tensors[i], one after another
};

inline std::vector<CopyChunk> bucket_copy_plan(const std::vector<at::Tensor>& tensors, const at::Tensor& bucket,
                                               BucketCopy direction) {
  const bool flatten = direction == BucketCopy::Flatten;
  const int64_t esize = static_cast<int64_t>(bucket.element_size());
  char* into_bucket = flatten ? static_cast<char*>(bucket.data_ptr()) : nullptr;
  const char* from_bucket = flatten ? nullptr : static_cast<const char*>(bucket.const_data_ptr());
  const at::Tensor flat = bucket.view({-1});
  std::vector<CopyChunk> plan;
  int64_t off = 0;
  for (const at::Tensor& t : tensors) {
    const int64_t n = t.numel();
    if (t.is_contiguous() && flatten) {
      plan_copy(plan, t.const_data_ptr(), into_bucket + off * esize, n * esize);
    } else if (t.is_contiguous()) {
      plan_copy(plan, from_bucket + off * esize, t.data_ptr(), n * esize);
    } else if (flatten) {
      flat.narrow(0, off, n).view(t.sizes()).copy_(t);
    } else {
      t.copy_(flat.narrow(0, off, n).view(t.sizes()));
    }
    off += n;
  }
  return plan;
}

}  // namespace pycoll

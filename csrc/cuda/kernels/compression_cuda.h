// Gradient-compression kernels for CUDA tensors: the same functions, layouts
// and results as cpu/kernels/compression.h (read that header for the terms).
// Every call runs on the caller's current stream of the tensor's device and
// does not synchronise the host. Arguments are checked by the caller
// (bindings/compression_bindings.cpp). Only built with PYCOLL_WITH_CUDA.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace pycoll {

at::Tensor pack_signs_cuda(const at::Tensor& x);
void unpack_signs_cuda(const at::Tensor& packed, int64_t numel, double scale, const at::Tensor& out);
void majority_vote_cuda(const at::Tensor& gathered, int64_t numel, double scale, const at::Tensor& out);
void batched_orthogonalize_cuda_(const at::Tensor& m, double eps);
void flatten_into_cuda(const std::vector<at::Tensor>& tensors, const at::Tensor& bucket);
void unflatten_from_cuda(const at::Tensor& bucket, const std::vector<at::Tensor>& tensors);

}  // namespace pycoll

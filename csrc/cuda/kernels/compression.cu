// Torch glue of the CUDA compression kernels (cuda/kernels/compression.cuh):
// device guard, dtype switch, grid sizes, launch on the current stream,
// launch check. Arguments were checked by bindings/compression_bindings.cpp.
#include "cuda/kernels/compression_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstring>

#include "common/bucket_copy.h"
#include "cuda/kernels/compression.cuh"

namespace pycoll {

namespace {

namespace ck = kernels::compression;

template <typename T>
struct Tag {
  using type = T;
};

// Calls fn(Tag<T>{}) with the CUDA element type of a floating dtype.
template <typename Fn>
void dispatch_floating(at::ScalarType t, const char* op, Fn&& fn) {
  switch (t) {
    case at::kFloat: fn(Tag<float>{}); break;
    case at::kDouble: fn(Tag<double>{}); break;
    case at::kHalf: fn(Tag<__half>{}); break;
    case at::kBFloat16: fn(Tag<__nv_bfloat16>{}); break;
    default: TORCH_CHECK_TYPE(false, op, ": expected a float32, float64, float16 or bfloat16 tensor, got ", t);
  }
}

// Blocks for `items` units of work at `per_block` units per block, capped at
// 8 blocks per SM (the kernels loop over the rest).
int grid_for(int64_t items, int64_t per_block) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, sms * 8)));
}

int64_t words_for(int64_t numel) { return (numel + 31) / 32; }

void run_copy_plan(const std::vector<CopyChunk>& plan, const at::Device& device) {
  if (plan.empty()) return;
  const int64_t bytes = static_cast<int64_t>(plan.size() * sizeof(CopyChunk));
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr(), plan.data(), static_cast<size_t>(bytes));
  // Stream-ordered: the upload, the kernel and the free of dev_plan all use
  // the current stream; the pinned buffer is kept alive by the host allocator
  // until the upload has run.
  at::Tensor dev_plan = host.to(device, /*non_blocking=*/true);
  const auto stream = at::cuda::getCurrentCUDAStream();
  ck::batched_copy_kernel<<<static_cast<unsigned>(plan.size()), ck::kThreads, 0, stream>>>(
      static_cast<const CopyChunk*>(dev_plan.const_data_ptr()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

at::Tensor pack_signs_cuda(const at::Tensor& x) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor src = x.contiguous();
  const int64_t numel = src.numel();
  const int64_t words = words_for(numel);
  at::Tensor out = at::empty({words}, src.options().dtype(at::kInt));
  if (numel == 0) return out;
  const auto stream = at::cuda::getCurrentCUDAStream();
  uint32_t* o = reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>());
  dispatch_floating(src.scalar_type(), "pycoll::pack_signs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(src.const_data_ptr());
    constexpr int64_t V = 16 / sizeof(T);
    if (reinterpret_cast<uintptr_t>(p) % 16 == 0) {
      const int64_t spans = numel / (32 * V);
      ck::pack_signs_kernel<T>
          <<<grid_for(std::max<int64_t>(spans, 1), ck::kWarps), ck::kThreads, 0, stream>>>(p, o, numel, spans);
    } else {
      ck::pack_signs_scalar_kernel<T><<<grid_for(words, ck::kWarps), ck::kThreads, 0, stream>>>(p, o, numel);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

void unpack_signs_cuda(const at::Tensor& packed, int64_t numel, double scale, const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(packed.device());
  const at::Tensor words = packed.contiguous();
  if (numel == 0) return;
  const auto stream = at::cuda::getCurrentCUDAStream();
  ck::unpack_signs_kernel<<<grid_for((numel + 3) / 4, ck::kThreads), ck::kThreads, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(words.const_data_ptr<int32_t>()), out.data_ptr<float>(), numel,
      static_cast<float>(scale));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void majority_vote_cuda(const at::Tensor& gathered, int64_t numel, double scale, const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(gathered.device());
  const at::Tensor g = gathered.stride(1) == 1 ? gathered : gathered.contiguous();
  if (numel == 0) return;
  const auto stream = at::cuda::getCurrentCUDAStream();
  ck::majority_vote_kernel<<<grid_for((numel + 3) / 4, ck::kThreads), ck::kThreads, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(g.const_data_ptr<int32_t>()), static_cast<int>(g.size(0)), g.stride(0),
      out.data_ptr<float>(), numel, static_cast<float>(scale));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void batched_orthogonalize_cuda_(const at::Tensor& m, double eps) {
  const c10::cuda::CUDAGuard guard(m.device());
  const int64_t batch = m.size(0), n = m.size(1), r = m.size(2);
  if (batch == 0 || n == 0 || r == 0) return;
  TORCH_CHECK_VALUE(batch <= 0x7fffffff, "pycoll::batched_orthogonalize_: at most 2^31-1 matrices, got ", batch);
  const auto stream = at::cuda::getCurrentCUDAStream();
  dispatch_floating(m.scalar_type(), "pycoll::batched_orthogonalize_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = typename ck::AccOf<T>::type;
    const size_t smem = static_cast<size_t>(r) * sizeof(A);
    TORCH_CHECK_VALUE(smem <= 32 * 1024, "pycoll::batched_orthogonalize_: rank (columns) up to ", 32 * 1024 / sizeof(A),
                      " on CUDA, got ", r);
    ck::gram_schmidt_kernel<T><<<static_cast<unsigned>(batch), ck::kThreads, smem, stream>>>(
        static_cast<T*>(m.data_ptr()), n, static_cast<int>(r), m.stride(0), m.stride(1), m.stride(2),
        static_cast<A>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void flatten_into_cuda(const std::vector<at::Tensor>& tensors, const at::Tensor& bucket) {
  const c10::cuda::CUDAGuard guard(bucket.device());
  run_copy_plan(bucket_copy_plan(tensors, bucket, BucketCopy::Flatten), bucket.device());
}

void unflatten_from_cuda(const at::Tensor& bucket, const std::vector<at::Tensor>& tensors) {
  const c10::cuda::CUDAGuard guard(bucket.device());
  run_copy_plan(bucket_copy_plan(tensors, bucket, BucketCopy::Unflatten), bucket.device());
}

}  // namespace pycoll

// Instantiates the kernels and launches them. Kept apart from the torch glue so that this (slow to
// compile) file includes only CUDA headers.
#include "cuda/launch.h"

#include "kernels/entry.cuh"

namespace pycoll {
namespace gpu {

namespace {

template <DType D>
cudaError_t launch_reduce_typed(KOp op, int grid, cudaStream_t stream, const kernels::ReduceArgs& a) {
  using namespace kernels;
  switch (op) {
    case KOp::Sum: reduce_kernel<D, OpSum><<<grid, kThreads, 0, stream>>>(a); break;
    case KOp::Prod: reduce_kernel<D, OpProd><<<grid, kThreads, 0, stream>>>(a); break;
    case KOp::Min: reduce_kernel<D, OpMin><<<grid, kThreads, 0, stream>>>(a); break;
    case KOp::Max: reduce_kernel<D, OpMax><<<grid, kThreads, 0, stream>>>(a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <DType D>
cudaError_t launch_reduce_bitwise(KOp op, int grid, cudaStream_t stream, const kernels::ReduceArgs& a) {
  using namespace kernels;
  switch (op) {
    case KOp::And: reduce_kernel<D, OpAnd><<<grid, kThreads, 0, stream>>>(a); break;
    case KOp::Or: reduce_kernel<D, OpOr><<<grid, kThreads, 0, stream>>>(a); break;
    case KOp::Xor: reduce_kernel<D, OpXor><<<grid, kThreads, 0, stream>>>(a); break;
    default: return launch_reduce_typed<D>(op, grid, stream, a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_reduce(DType dtype, KOp op, int grid, cudaStream_t stream, const kernels::ReduceArgs& a) {
  switch (dtype) {
    case DType::Float32: return launch_reduce_typed<DType::Float32>(op, grid, stream, a);
    case DType::Float64: return launch_reduce_typed<DType::Float64>(op, grid, stream, a);
    case DType::Float16: return launch_reduce_typed<DType::Float16>(op, grid, stream, a);
    case DType::BFloat16: return launch_reduce_typed<DType::BFloat16>(op, grid, stream, a);
    case DType::Int8: return launch_reduce_typed<DType::Int8>(op, grid, stream, a);
    case DType::UInt8: return launch_reduce_bitwise<DType::UInt8>(op, grid, stream, a);
    case DType::Int32: return launch_reduce_bitwise<DType::Int32>(op, grid, stream, a);
    case DType::Int64: return launch_reduce_bitwise<DType::Int64>(op, grid, stream, a);
    case DType::Bool: break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_copy(int grid, cudaStream_t stream, const kernels::CopyArgs& a) {
  kernels::copy_kernel<<<grid, kernels::kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_p2p(int grid, cudaStream_t stream, const kernels::P2PArgs& a) {
  kernels::p2p_kernel<<<grid, kernels::kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace pycoll

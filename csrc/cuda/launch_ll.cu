// Compiles the LL all-reduce kernels (one per dtype and reduce op: their inner loop is a few
// instructions, so they are instantiated whole rather than dispatched per step) and launches them.
// A file of its own so that it compiles in parallel with launch.cu.
#include "cuda/launch.h"
#include "cuda/launch_config.h"

#include "kernels/ll_all_reduce.cuh"

namespace pycoll {
namespace gpu {

namespace {

using kernels::ReduceArgs;
using kernels::ReduceOp;
using LLKernel = void (*)(ReduceArgs);

template <DType D>
LLKernel arith(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return kernels::ll_all_reduce_kernel<D, kernels::OpSum>;
    case ReduceOp::Prod: return kernels::ll_all_reduce_kernel<D, kernels::OpProd>;
    case ReduceOp::Min: return kernels::ll_all_reduce_kernel<D, kernels::OpMin>;
    case ReduceOp::Max: return kernels::ll_all_reduce_kernel<D, kernels::OpMax>;
    default: return nullptr;
  }
}

template <DType D>
LLKernel arith_or_bitwise(ReduceOp op) {
  switch (op) {
    case ReduceOp::And: return kernels::ll_all_reduce_kernel<D, kernels::OpAnd>;
    case ReduceOp::Or: return kernels::ll_all_reduce_kernel<D, kernels::OpOr>;
    case ReduceOp::Xor: return kernels::ll_all_reduce_kernel<D, kernels::OpXor>;
    default: return arith<D>(op);
  }
}

LLKernel ll_kernel_for(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::Float32: return arith<DType::Float32>(op);
    case DType::Float64: return arith<DType::Float64>(op);
    case DType::Float16: return arith<DType::Float16>(op);
    case DType::BFloat16: return arith<DType::BFloat16>(op);
    case DType::Int8: return arith<DType::Int8>(op);
    case DType::UInt8: return arith_or_bitwise<DType::UInt8>(op);
    case DType::Int32: return arith_or_bitwise<DType::Int32>(op);
    case DType::Int64: return arith_or_bitwise<DType::Int64>(op);
    default: return nullptr;
  }
}

}  // namespace

cudaError_t launch_ll_all_reduce(int grid, cudaStream_t stream, const kernels::ReduceArgs& a, bool early) {
  const LLKernel k = ll_kernel_for(a.dtype, a.rop);
  if (k == nullptr) return cudaErrorInvalidValue;  // the host maps every valid pair (cuda_engine.cu)
  return launch_kernel(k, grid, kernels::kLLThreads, stream, a, early);
}

bool ll_kernels_support_early_launch() {
  return compiled_with_grid_dependency(kernels::ll_all_reduce_kernel<DType::Float32, kernels::OpSum>);
}

}  // namespace gpu
}  // namespace pycoll

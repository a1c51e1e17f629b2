// The instantiation of a reduce kernel family for a (dtype, reduce op) pair. The LL and LL128
// all-reduce kernels are instantiated whole per pair (their inner loops are a few instructions, so
// a per-step dispatch would cost more than it saves); this table is the one place that lists which
// pairs exist: arithmetic ops for every dtype, bitwise ones for the unsigned and integer types (Bool
// and Int8 bitwise ops reach here mapped onto these by cuda_engine.cu: kernel_type).
//
// A family is a struct with `using Fn = void (*)(kernels::ReduceArgs)` and
// `template <DType D, class Op> static Fn get()`.
#pragma once

#include "common/types.h"
#include "cuda/kernels/args.h"
#include "cuda/kernels/vec.cuh"

namespace pycoll {
namespace gpu {

template <class Family, DType D>
typename Family::Fn arith_kernel(kernels::ReduceOp op) {
  switch (op) {
    case kernels::ReduceOp::Sum: return Family::template get<D, kernels::OpSum>();
    case kernels::ReduceOp::Prod: return Family::template get<D, kernels::OpProd>();
    case kernels::ReduceOp::Min: return Family::template get<D, kernels::OpMin>();
    case kernels::ReduceOp::Max: return Family::template get<D, kernels::OpMax>();
    default: return nullptr;
  }
}

template <class Family, DType D>
typename Family::Fn arith_or_bitwise_kernel(kernels::ReduceOp op) {
  switch (op) {
    case kernels::ReduceOp::And: return Family::template get<D, kernels::OpAnd>();
    case kernels::ReduceOp::Or: return Family::template get<D, kernels::OpOr>();
    case kernels::ReduceOp::Xor: return Family::template get<D, kernels::OpXor>();
    default: return arith_kernel<Family, D>(op);
  }
}

// nullptr for a pair the family has no kernel for (the host maps every valid pair onto one).
template <class Family>
typename Family::Fn reduce_kernel_for(DType dtype, kernels::ReduceOp op) {
  switch (dtype) {
    case DType::Float32: return arith_kernel<Family, DType::Float32>(op);
    case DType::Float64: return arith_kernel<Family, DType::Float64>(op);
    case DType::Float16: return arith_kernel<Family, DType::Float16>(op);
    case DType::BFloat16: return arith_kernel<Family, DType::BFloat16>(op);
    case DType::Int8: return arith_kernel<Family, DType::Int8>(op);
    case DType::UInt8: return arith_or_bitwise_kernel<Family, DType::UInt8>(op);
    case DType::Int32: return arith_or_bitwise_kernel<Family, DType::Int32>(op);
    case DType::Int64: return arith_or_bitwise_kernel<Family, DType::Int64>(op);
    default: return nullptr;
  }
}

}  // namespace gpu
}  // namespace pycoll

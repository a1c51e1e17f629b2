// Which torch dtypes the engines reduce, and which ops only move bytes.
//
// Data-movement ops (broadcast, all_gather, all_to_all, gather, scatter, send/recv) move any
// dtype as bytes, as NCCL and Gloo do; only reductions need to know the element type.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "common/types.h"

namespace pycoll {

// The engine dtype for reductions on `t`, or nullopt when no engine reduces it.
std::optional<DType> reducible_dtype(at::ScalarType t);
// The reducible dtype of `t`, or a TypeError naming the op and what is supported.
DType reducible_dtype_or_throw(const char* op, at::ScalarType t);

// True for the dtypes the CUDA engine's kernels reduce; the others (int16, float8) reach CUDA
// tensors through host memory, where the CPU engine reduces them (float8 in float32).
inline bool cuda_kernels_reduce(DType t) {
  return t != DType::Int16 && t != DType::Float8E4M3 && t != DType::Float8E5M2;
}

inline bool moves_as_bytes(OpCode op) {
  return op == OpCode::Broadcast || op == OpCode::AllGather || op == OpCode::AllToAll || op == OpCode::Gather ||
         op == OpCode::Scatter || op == OpCode::Barrier;
}

}  // namespace pycoll

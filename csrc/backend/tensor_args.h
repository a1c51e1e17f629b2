// Argument checks and torch <-> engine type mapping. Every message starts
// with the op ("pycoll::allreduce: ...") and names the argument and what was
// expected, so that a user sees which call was wrong.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "common/types.h"

namespace pycoll {

// Maps the c10d reduce op for a reduction on dtype t; rejects dtypes no engine reduces
// (TypeError) and combinations the engines cannot do (bitwise ops on floats, AVG/PREMUL_SUM on
// integers, AVG on bool).
ReduceKind to_reduce(const char* op, const c10d::ReduceOp& r, at::ScalarType t);
// PREMUL_SUM's factor (scalar or one-element tensor), as a double.
at::Tensor premul_factor(const c10d::ReduceOp& r);

void check_one_tensor(const char* op, const std::vector<at::Tensor>& tensors);
void check_dense(const char* op, const at::Tensor& t, const char* what);
void check_same_type(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* what);
void check_rank(const char* op, int64_t rank, int size, const char* what);

}  // namespace pycoll

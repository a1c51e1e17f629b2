// What the CUDA kernels run for a (dtype, reduce op): Bool runs as UInt8 with OR/AND/XOR, Int8
// bitwise ops as UInt8 (sign does not matter), Avg as Sum with a final division by the world
// size. Plain C++.
#pragma once

#include "common/types.h"
#include "cuda/kernels/args.h"

namespace pycoll {
namespace gpu {

struct KernelType {
  DType dtype;
  kernels::ReduceOp op;
  int div;  // 1, or the world size (Avg)
};

// Raises (naming `op`, the collective) for a reduce op the dtype does not have.
KernelType kernel_type(DType d, ReduceKind r, int nranks, const char* op);

}  // namespace gpu
}  // namespace pycoll

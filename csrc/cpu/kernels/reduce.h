// Element-wise reduction on the CPU, in a fixed source order so that every
// rank that reduces the same sources gets bitwise-identical results.
//
// fp16, bf16 and float8 are accumulated in fp32 ("acc" type); partial results that
// travel between ranks (ring, tree) may be kept in the acc type so that
// precision is not lost between hops. For every other dtype acc == element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace pycoll {

struct ReduceSpec {
  DType dtype;
  ReduceKind op;  // Sum, Avg, Product, Min, Max, BAnd, BOr, BXor (PremulSum is pre-scaled by the caller)
  int world;      // divisor for Avg
};

// One operand: a pointer and whether it holds acc-typed values.
struct Operand {
  const void* ptr;
  bool acc;
};

// True for the dtypes reduced in float32 (fp16, bf16, float8).
bool accumulates_in_float(DType t);
// Bytes per element of the acc type (4 for those, else the dtype size).
size_t acc_size(DType t);

// out[i] = src0[i] op src1[i] op ... (left to right), converted to out's type;
// with `finalize` and Avg the sum is divided by spec.world before the store.
void reduce_operands(const ReduceSpec& spec, void* out, bool out_acc, const Operand* srcs, int nsrc, int64_t count,
                     bool finalize);

// Converts count elements between element and acc representation (copy when equal).
void convert_elements(DType t, void* out, bool out_acc, const void* in, bool in_acc, int64_t count);

// True if the reduce op is defined for the dtype (bitwise ops need integers or bool; Avg needs floats).
bool reduce_supported(DType t, ReduceKind op);

}  // namespace pycoll

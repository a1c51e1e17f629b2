#include "engines/dtypes.h"

#include <c10/util/Exception.h>

namespace pycoll {

std::optional<DType> reducible_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kChar: return DType::Int8;
    case at::kByte: return DType::UInt8;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kBool: return DType::Bool;
    case at::kShort: return DType::Int16;
    case at::kFloat8_e4m3fn: return DType::Float8E4M3;
    case at::kFloat8_e5m2: return DType::Float8E5M2;
    default: return std::nullopt;
  }
}

DType reducible_dtype_or_throw(const char* op, at::ScalarType t) {
  if (auto d = reducible_dtype(t)) return *d;
  TORCH_CHECK_TYPE(
      false, op, ": unsupported dtype ", t, " for a reduction; reductions support float32, float64, ",
      "float16, bfloat16, float8_e4m3fn, float8_e5m2, int8, uint8, int16, int32, int64, bool (data-movement "
      "ops take any dtype)");
}

}  // namespace pycoll

#include "cuda/kernel_type.h"

#include <c10/util/Exception.h>

namespace pycoll {
namespace gpu {

using KOp = kernels::ReduceOp;

KernelType kernel_type(DType d, ReduceKind r, int nranks, const char* op) {
  TORCH_CHECK(r != ReduceKind::PremulSum, "pycoll::", op,
              ": PREMUL_SUM reaches the CUDA engine as a pre-scale + SUM (backend's job)");
  if (d == DType::Bool) {
    switch (r) {
      case ReduceKind::Sum:
      case ReduceKind::Avg:
      case ReduceKind::Max:
      case ReduceKind::BOr: return {DType::UInt8, KOp::Or, 1};
      case ReduceKind::Product:
      case ReduceKind::Min:
      case ReduceKind::BAnd: return {DType::UInt8, KOp::And, 1};
      case ReduceKind::BXor: return {DType::UInt8, KOp::Xor, 1};
      default: break;
    }
    TORCH_CHECK(false, "pycoll::", op, ": unsupported reduce op ", reduce_name(r), " for bool");
  }
  switch (r) {
    case ReduceKind::Sum: return {d, KOp::Sum, 1};
    case ReduceKind::Avg: return {d, KOp::Sum, nranks};
    case ReduceKind::Product: return {d, KOp::Prod, 1};
    case ReduceKind::Min: return {d, KOp::Min, 1};
    case ReduceKind::Max: return {d, KOp::Max, 1};
    case ReduceKind::BAnd:
    case ReduceKind::BOr:
    case ReduceKind::BXor: {
      TORCH_CHECK(!is_floating(d), "pycoll::", op, ": ", reduce_name(r), " needs an integer or bool tensor, got ",
                  dtype_name(d));
      const DType kd = d == DType::Int8 ? DType::UInt8 : d;
      const KOp k = r == ReduceKind::BAnd ? KOp::And : (r == ReduceKind::BOr ? KOp::Or : KOp::Xor);
      return {kd, k, 1};
    }
    default: break;
  }
  TORCH_CHECK(false, "pycoll::", op, ": unsupported reduce op ", reduce_name(r));
}

}  // namespace gpu
}  // namespace pycoll

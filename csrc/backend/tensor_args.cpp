#include "backend/tensor_args.h"

#include "common/check.h"
#include "engines/dtypes.h"

namespace pycoll {

ReduceKind to_reduce(const char* op, const c10d::ReduceOp& r, at::ScalarType dtype) {
  const DType t = reducible_dtype_or_throw(op, dtype);
  ReduceKind k;
  switch (r.op_) {
    case c10d::ReduceOp::SUM: k = ReduceKind::Sum; break;
    case c10d::ReduceOp::AVG: k = ReduceKind::Avg; break;
    case c10d::ReduceOp::PRODUCT: k = ReduceKind::Product; break;
    case c10d::ReduceOp::MIN: k = ReduceKind::Min; break;
    case c10d::ReduceOp::MAX: k = ReduceKind::Max; break;
    case c10d::ReduceOp::BAND: k = ReduceKind::BAnd; break;
    case c10d::ReduceOp::BOR: k = ReduceKind::BOr; break;
    case c10d::ReduceOp::BXOR: k = ReduceKind::BXor; break;
    case c10d::ReduceOp::PREMUL_SUM: k = ReduceKind::PremulSum; break;
    default: TORCH_CHECK_VALUE(false, op, ": unknown reduce op ", static_cast<int>(r.op_));
  }
  const bool is_float = is_floating(t);
  if (k == ReduceKind::BAnd || k == ReduceKind::BOr || k == ReduceKind::BXor) {
    TORCH_CHECK_VALUE(!is_float, op, ": reduce op ", reduce_name(k), " is not supported for dtype ", dtype_name(t),
                      " (bitwise ops need an integer or bool dtype)");
  }
  if (k == ReduceKind::Avg || k == ReduceKind::PremulSum) {
    TORCH_CHECK_VALUE(is_float, op, ": reduce op ", reduce_name(k), " is not supported for dtype ", dtype_name(t),
                      " (it needs a floating-point dtype)");
  }
  return k;
}

at::Tensor premul_factor(const c10d::ReduceOp& r) {
  auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(r.supplement_.get());
  TORCH_CHECK_VALUE(sup != nullptr, "pycoll: PREMUL_SUM without a factor (use dist._make_nccl_premul_sum)");
  if (sup->tensor_factor.defined()) return sup->tensor_factor;
  return at::scalar_tensor(sup->double_factor, at::kDouble);
}

void check_one_tensor(const char* op, const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK_VALUE(tensors.size() == 1, op, ": expected exactly one tensor per rank, got ", tensors.size());
}

void check_dense(const char* op, const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.defined(), op, ": ", what, " is undefined");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, op, ": ", what, " must be a dense (strided) tensor, got layout ",
                    t.layout());
  TORCH_CHECK_VALUE(t.is_cpu() || t.is_cuda(), op, ": ", what, " must be on cpu or cuda, got device ", t.device());
}

void check_same_type(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* what) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": ", what, " has dtype ", t.scalar_type(),
                   " but the input has dtype ", ref.scalar_type());
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", what, " is on ", t.device(), " but the input is on ",
                    ref.device());
}

void check_rank(const char* op, int64_t rank, int size, const char* what) {
  TORCH_CHECK_VALUE(rank >= 0 && rank < size, op, ": ", what, " ", rank, " is out of range for a group of size ", size);
}

}  // namespace pycoll

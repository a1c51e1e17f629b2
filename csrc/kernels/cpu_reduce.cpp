#include "kernels/cpu_reduce.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include "common/check.h"

namespace pycoll {

namespace {

struct OpSum { template <typename A> A operator()(A a, A b) const { return a + b; } };
struct OpProd { template <typename A> A operator()(A a, A b) const { return a * b; } };
struct OpMin { template <typename A> A operator()(A a, A b) const { return b < a ? b : a; } };
struct OpMax { template <typename A> A operator()(A a, A b) const { return a < b ? b : a; } };
struct OpBAnd { template <typename A> A operator()(A a, A b) const { return a & b; } };
struct OpBOr { template <typename A> A operator()(A a, A b) const { return a | b; } };
struct OpBXor { template <typename A> A operator()(A a, A b) const { return a ^ b; } };

// Block size in elements: the accumulator stays in L1 while every source
// streams through it once.
constexpr int64_t kBlock = 2048;

template <typename T, typename Acc>
inline void load_block(Acc* dst, const Operand& src, int64_t base, int64_t n) {
  if (std::is_same<T, Acc>::value || src.acc) {
    std::memcpy(dst, static_cast<const Acc*>(src.ptr) + base, n * sizeof(Acc));
  } else {
    const T* p = static_cast<const T*>(src.ptr) + base;
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Acc>(p[i]);
  }
}

template <typename T, typename Acc, typename Op>
void reduce_loop(const ReduceSpec& spec, void* out, bool out_acc, const Operand* srcs, int nsrc, int64_t count,
                 bool finalize) {
  Op op;
  alignas(64) Acc buf[kBlock];
  const bool avg = finalize && spec.op == ReduceKind::Avg;
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t n = std::min(kBlock, count - base);
    load_block<T, Acc>(buf, srcs[0], base, n);
    for (int s = 1; s < nsrc; ++s) {
      if (std::is_same<T, Acc>::value || srcs[s].acc) {
        const Acc* p = static_cast<const Acc*>(srcs[s].ptr) + base;
        for (int64_t i = 0; i < n; ++i) buf[i] = op(buf[i], p[i]);
      } else {
        const T* p = static_cast<const T*>(srcs[s].ptr) + base;
        for (int64_t i = 0; i < n; ++i) buf[i] = op(buf[i], static_cast<Acc>(p[i]));
      }
    }
    if constexpr (std::is_floating_point<Acc>::value) {
      if (avg) {
        const Acc w = static_cast<Acc>(spec.world);
        for (int64_t i = 0; i < n; ++i) buf[i] = buf[i] / w;
      }
    }
    if (std::is_same<T, Acc>::value || out_acc) {
      std::memcpy(static_cast<Acc*>(out) + base, buf, n * sizeof(Acc));
    } else {
      T* o = static_cast<T*>(out) + base;
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(buf[i]);
    }
  }
}

template <typename T, typename Acc>
void dispatch_op(const ReduceSpec& spec, void* out, bool out_acc, const Operand* srcs, int nsrc, int64_t count,
                 bool finalize, bool is_bool) {
  ReduceKind op = spec.op;
  if (is_bool) {
    // bool follows ProcessGroupNCCL: SUM and MAX are OR, PRODUCT and MIN are AND.
    if (op == ReduceKind::Sum) op = ReduceKind::Max;
    if (op == ReduceKind::Product) op = ReduceKind::Min;
  }
  switch (op) {
    case ReduceKind::Sum:
    case ReduceKind::Avg:
    case ReduceKind::PremulSum:
      return reduce_loop<T, Acc, OpSum>(spec, out, out_acc, srcs, nsrc, count, finalize);
    case ReduceKind::Product:
      return reduce_loop<T, Acc, OpProd>(spec, out, out_acc, srcs, nsrc, count, finalize);
    case ReduceKind::Min:
      return reduce_loop<T, Acc, OpMin>(spec, out, out_acc, srcs, nsrc, count, finalize);
    case ReduceKind::Max:
      return reduce_loop<T, Acc, OpMax>(spec, out, out_acc, srcs, nsrc, count, finalize);
    case ReduceKind::BAnd:
    case ReduceKind::BOr:
    case ReduceKind::BXor:
      if constexpr (std::is_integral<Acc>::value) {
        if (op == ReduceKind::BAnd) return reduce_loop<T, Acc, OpBAnd>(spec, out, out_acc, srcs, nsrc, count, finalize);
        if (op == ReduceKind::BOr) return reduce_loop<T, Acc, OpBOr>(spec, out, out_acc, srcs, nsrc, count, finalize);
        return reduce_loop<T, Acc, OpBXor>(spec, out, out_acc, srcs, nsrc, count, finalize);
      }
      break;
  }
  throw std::invalid_argument(str("pycoll: reduce op ", reduce_name(spec.op), " is not supported for dtype ",
                                  dtype_name(spec.dtype)));
}

}  // namespace

// The dtypes reduced in float32 (narrow floats): fp16, bf16 and both float8 formats.
bool accumulates_in_float(DType t) {
  return t == DType::Float16 || t == DType::BFloat16 || t == DType::Float8E4M3 || t == DType::Float8E5M2;
}

size_t acc_size(DType t) { return accumulates_in_float(t) ? sizeof(float) : dtype_size(t); }

bool reduce_supported(DType t, ReduceKind op) {
  const bool is_float = is_floating(t);
  switch (op) {
    case ReduceKind::BAnd:
    case ReduceKind::BOr:
    case ReduceKind::BXor:
      return !is_float;
    case ReduceKind::Avg:
    case ReduceKind::PremulSum:
      return is_float;
    default:
      return true;
  }
}

void reduce_operands(const ReduceSpec& spec, void* out, bool out_acc, const Operand* srcs, int nsrc, int64_t count,
                     bool finalize) {
  if (count <= 0) return;
  switch (spec.dtype) {
    case DType::Float32: return dispatch_op<float, float>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Float64: return dispatch_op<double, double>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Float16: return dispatch_op<c10::Half, float>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::BFloat16: return dispatch_op<c10::BFloat16, float>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Int8: return dispatch_op<int8_t, int8_t>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::UInt8: return dispatch_op<uint8_t, uint8_t>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Int32: return dispatch_op<int32_t, int32_t>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Int64: return dispatch_op<int64_t, int64_t>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Bool: return dispatch_op<uint8_t, uint8_t>(spec, out, out_acc, srcs, nsrc, count, finalize, true);
    case DType::Int16: return dispatch_op<int16_t, int16_t>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Float8E4M3:
      return dispatch_op<c10::Float8_e4m3fn, float>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Float8E5M2:
      return dispatch_op<c10::Float8_e5m2, float>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
  }
}

void convert_elements(DType t, void* out, bool out_acc, const void* in, bool in_acc, int64_t count) {
  if (count <= 0) return;
  if (!accumulates_in_float(t) || out_acc == in_acc) {
    std::memcpy(out, in, static_cast<size_t>(count) * (out_acc ? acc_size(t) : dtype_size(t)));
    return;
  }
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (out_acc) {
      const T* p = static_cast<const T*>(in);
      float* o = static_cast<float*>(out);
      for (int64_t i = 0; i < count; ++i) o[i] = static_cast<float>(p[i]);
    } else {
      const float* p = static_cast<const float*>(in);
      T* o = static_cast<T*>(out);
      for (int64_t i = 0; i < count; ++i) o[i] = static_cast<T>(p[i]);
    }
  };
  switch (t) {
    case DType::Float16: return run(c10::Half());
    case DType::BFloat16: return run(c10::BFloat16());
    case DType::Float8E4M3: return run(c10::Float8_e4m3fn());
    default: return run(c10::Float8_e5m2());
  }
}

}  // namespace pycoll

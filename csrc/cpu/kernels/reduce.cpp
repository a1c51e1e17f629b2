#include "cpu/kernels/reduce.h"

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

struct OpSum {
  template <typename A>
  A operator()(A a, A b) const {
    return a + b;
  }
};
struct OpProd {
  template <typename A>
  A operator()(A a, A b) const {
    return a * b;
  }
};
struct OpMin {
  template <typename A>
  A operator()(A a, A b) const {
    return b < a ? b : a;
  }
};
struct OpMax {
  template <typename A>
  A operator()(A a, A b) const {
    return a < b ? b : a;
  }
};
struct OpBAnd {
  template <typename A>
  A operator()(A a, A b) const {
    return a & b;
  }
};
struct OpBOr {
  template <typename A>
  A operator()(A a, A b) const {
    return a | b;
  }
};
struct OpBXor {
  template <typename A>
  A operator()(A a, A b) const {
    return a ^ b;
  }
};

// Block size in elements: the accumulator stays in L1 while every source
// streams through it once.
constexpr int64_t kBlock = 2048;

// The loops below are compiled three times (x86-64-v4: AVX-512 with its byte/word forms,
// x86-64-v3: AVX2, FMA, F16C, and baseline x86-64) and the CPU's best is picked when the library
// loads: the extension is built without -march, so that one build runs on any x86-64, and a
// baseline SSE2 loop is far slower than an AVX one. The levels, not bare "avx512f": without
// AVX512BW the float -> fp16 conversion stays scalar (docs/decisions/0028-cpu-reduction-loops.md).
// Each element still goes through the same IEEE operations in the same order, so every clone gives
// the same bits; setup.py compiles with -ffp-contract=off so that no clone fuses a multiply and an
// add (c10's fp16 conversion has both).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define PYCOLL_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PYCOLL_SIMD_CLONES
#endif

// out[i] = op(x[i], y[i]). out may be x or y itself (each element is read before it is written).
template <typename A, typename Op>
PYCOLL_SIMD_CLONES void combine(A* out, const A* x, const A* y, int64_t n) {
  Op op;
  for (int64_t i = 0; i < n; ++i) out[i] = op(x[i], y[i]);
}

// acc[i] = op(acc[i], A(p[i])), p in the element type.
template <typename T, typename A, typename Op>
PYCOLL_SIMD_CLONES void combine_widened(A* acc, const T* p, int64_t n) {
  Op op;
  for (int64_t i = 0; i < n; ++i) acc[i] = op(acc[i], static_cast<A>(p[i]));
}

template <typename A>
PYCOLL_SIMD_CLONES void divide(A* x, A w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / w;
}

template <typename From, typename To>
PYCOLL_SIMD_CLONES void convert(To* out, const From* in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<To>(in[i]);
}

template <typename T, typename Acc>
inline void load_block(Acc* dst, const Operand& src, int64_t base, int64_t n) {
  if (std::is_same<T, Acc>::value || src.acc) {
    std::memcpy(dst, static_cast<const Acc*>(src.ptr) + base, n * sizeof(Acc));
  } else {
    convert<T, Acc>(dst, static_cast<const T*>(src.ptr) + base, n);
  }
}

bool overlaps(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

// Every operand already in the output's type (no widening): reduce straight into the output, a
// block at a time, without the L1 buffer. The first two sources are combined in one pass, so the
// output may be either of them; a later source the output overlaps would be overwritten before it
// is read, so those calls take the buffered loop.
template <typename A, typename Op>
bool reduce_into_output(const ReduceSpec& spec, A* out, const Operand* srcs, int nsrc, int64_t count, bool avg) {
  const size_t bytes = static_cast<size_t>(count) * sizeof(A);
  for (int s = 0; s < nsrc; ++s) {
    if (overlaps(out, srcs[s].ptr, bytes) && (s >= 2 || srcs[s].ptr != out)) return false;
  }
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t n = std::min(kBlock, count - base);
    A* o = out + base;
    const A* s0 = static_cast<const A*>(srcs[0].ptr) + base;
    if (nsrc == 1) {
      if (o != s0) std::memcpy(o, s0, n * sizeof(A));
    } else {
      combine<A, Op>(o, s0, static_cast<const A*>(srcs[1].ptr) + base, n);
    }
    for (int s = 2; s < nsrc; ++s) combine<A, Op>(o, o, static_cast<const A*>(srcs[s].ptr) + base, n);
    if constexpr (std::is_floating_point<A>::value) {
      if (avg) divide<A>(o, static_cast<A>(spec.world), n);
    }
  }
  return true;
}

template <typename T, typename Acc, typename Op>
void reduce_loop(const ReduceSpec& spec, void* out, bool out_acc, const Operand* srcs, int nsrc, int64_t count,
                 bool finalize) {
  const bool avg = finalize && spec.op == ReduceKind::Avg;
  // fp16/bf16/float8 skip the widening only when every operand already holds acc-typed values.
  const bool all_acc = std::is_same<T, Acc>::value ||
                       (out_acc && std::all_of(srcs, srcs + nsrc, [](const Operand& o) { return o.acc; }));
  if (all_acc && reduce_into_output<Acc, Op>(spec, static_cast<Acc*>(out), srcs, nsrc, count, avg)) return;

  alignas(64) Acc buf[kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t n = std::min(kBlock, count - base);
    load_block<T, Acc>(buf, srcs[0], base, n);
    for (int s = 1; s < nsrc; ++s) {
      if (std::is_same<T, Acc>::value || srcs[s].acc) {
        combine<Acc, Op>(buf, buf, static_cast<const Acc*>(srcs[s].ptr) + base, n);
      } else {
        combine_widened<T, Acc, Op>(buf, static_cast<const T*>(srcs[s].ptr) + base, n);
      }
    }
    if constexpr (std::is_floating_point<Acc>::value) {
      if (avg) divide<Acc>(buf, static_cast<Acc>(spec.world), n);
    }
    if (std::is_same<T, Acc>::value || out_acc) {
      std::memcpy(static_cast<Acc*>(out) + base, buf, n * sizeof(Acc));
    } else {
      convert<Acc, T>(static_cast<T*>(out) + base, buf, n);
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
    case ReduceKind::PremulSum: return reduce_loop<T, Acc, OpSum>(spec, out, out_acc, srcs, nsrc, count, finalize);
    case ReduceKind::Product: return reduce_loop<T, Acc, OpProd>(spec, out, out_acc, srcs, nsrc, count, finalize);
    case ReduceKind::Min: return reduce_loop<T, Acc, OpMin>(spec, out, out_acc, srcs, nsrc, count, finalize);
    case ReduceKind::Max: return reduce_loop<T, Acc, OpMax>(spec, out, out_acc, srcs, nsrc, count, finalize);
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
  throw std::invalid_argument(
      str("pycoll: reduce op ", reduce_name(spec.op), " is not supported for dtype ", dtype_name(spec.dtype)));
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
    case ReduceKind::BXor: return !is_float;
    case ReduceKind::Avg:
    case ReduceKind::PremulSum: return is_float;
    default: return true;
  }
}

void reduce_operands(const ReduceSpec& spec, void* out, bool out_acc, const Operand* srcs, int nsrc, int64_t count,
                     bool finalize) {
  if (count <= 0) return;
  switch (spec.dtype) {
    case DType::Float32: return dispatch_op<float, float>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Float64: return dispatch_op<double, double>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::Float16: return dispatch_op<c10::Half, float>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
    case DType::BFloat16:
      return dispatch_op<c10::BFloat16, float>(spec, out, out_acc, srcs, nsrc, count, finalize, false);
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
      convert<T, float>(static_cast<float*>(out), static_cast<const T*>(in), count);
    } else {
      convert<float, T>(static_cast<T*>(out), static_cast<const float*>(in), count);
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

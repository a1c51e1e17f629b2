// Element types and reduce operations of the CUDA kernels: 16-byte packed vectors, L2-only loads,
// accumulation in fp32 for fp16/bf16. No torch here.
//
// Conventions
//   Store type T: the bits as they sit in memory (fp16 and bf16 are carried as uint16_t).
//   Acc type:     what a reduction computes in (float for fp16/bf16/fp32, double for fp64, the
//                 integer type itself for integers: integer sums and products wrap modulo 2^bits,
//                 like NCCL's, computed through the unsigned type so that no overflow is undefined).
//   Pack:         16 bytes = kPack<T> elements, loaded and stored as one uint4.
//   Bool is not a kernel type: the host runs it as UInt8 with OR (sum/max), AND (product/min), XOR.
//   Avg is not a kernel op: the host runs Sum with `div` = world size, applied once, by the rank
//   that produces the final value (integers: the wrapped sum divided, truncating toward zero).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/types.h"

namespace pycoll {
namespace kernels {

template <DType D>
struct DTypeTraits;

template <>
struct DTypeTraits<DType::Float32> {
  using T = float;
  using Acc = float;
  static __device__ __forceinline__ Acc to_acc(T x) { return x; }
  static __device__ __forceinline__ T from_acc(Acc a) { return a; }
};
template <>
struct DTypeTraits<DType::Float64> {
  using T = double;
  using Acc = double;
  static __device__ __forceinline__ Acc to_acc(T x) { return x; }
  static __device__ __forceinline__ T from_acc(Acc a) { return a; }
};
template <>
struct DTypeTraits<DType::Float16> {
  using T = uint16_t;
  using Acc = float;
  static __device__ __forceinline__ Acc to_acc(T x) { return __half2float(__ushort_as_half(x)); }
  static __device__ __forceinline__ T from_acc(Acc a) { return __half_as_ushort(__float2half_rn(a)); }
};
template <>
struct DTypeTraits<DType::BFloat16> {
  using T = uint16_t;
  using Acc = float;
  static __device__ __forceinline__ Acc to_acc(T x) { return __bfloat162float(__ushort_as_bfloat16(x)); }
  static __device__ __forceinline__ T from_acc(Acc a) { return __bfloat16_as_ushort(__float2bfloat16_rn(a)); }
};
template <class I>
struct IntTraits {
  using T = I;
  using Acc = I;
  static __device__ __forceinline__ Acc to_acc(T x) { return x; }
  static __device__ __forceinline__ T from_acc(Acc a) { return a; }
};
template <>
struct DTypeTraits<DType::Int8> : IntTraits<int8_t> {};
template <>
struct DTypeTraits<DType::UInt8> : IntTraits<uint8_t> {};
template <>
struct DTypeTraits<DType::Int32> : IntTraits<int32_t> {};
template <>
struct DTypeTraits<DType::Int64> : IntTraits<int64_t> {};

template <class T>
constexpr int kPack = 16 / int(sizeof(T));

// ---- reduce operations on Acc values --------------------------------------------------------

__device__ __forceinline__ float vmin(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double vmin(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ float vmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double vmax(double a, double b) { return fmax(a, b); }
template <class I>
__device__ __forceinline__ I vmin(I a, I b) {
  return b < a ? b : a;
}
template <class I>
__device__ __forceinline__ I vmax(I a, I b) {
  return a < b ? b : a;
}

struct OpSum {
  template <class A>
  static __device__ __forceinline__ A apply(A a, A b) {
    if constexpr (std::is_integral<A>::value) {
      using U = typename std::make_unsigned<A>::type;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct OpProd {
  template <class A>
  static __device__ __forceinline__ A apply(A a, A b) {
    if constexpr (std::is_integral<A>::value) {
      using U = typename std::make_unsigned<A>::type;
      // unsigned char/short promote to int: do the product in unsigned 32/64 bits.
      using W = typename std::conditional<(sizeof(A) < 4), uint32_t, U>::type;
      return static_cast<A>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
    } else {
      return a * b;
    }
  }
};
struct OpMin {
  template <class A>
  static __device__ __forceinline__ A apply(A a, A b) {
    return vmin(a, b);
  }
};
struct OpMax {
  template <class A>
  static __device__ __forceinline__ A apply(A a, A b) {
    return vmax(a, b);
  }
};
struct OpAnd {
  template <class A>
  static __device__ __forceinline__ A apply(A a, A b) {
    return static_cast<A>(a & b);
  }
};
struct OpOr {
  template <class A>
  static __device__ __forceinline__ A apply(A a, A b) {
    return static_cast<A>(a | b);
  }
};
struct OpXor {
  template <class A>
  static __device__ __forceinline__ A apply(A a, A b) {
    return static_cast<A>(a ^ b);
  }
};

// Avg's final division (div > 1). Integers divide the wrapped value, truncating toward zero.
template <class A>
__device__ __forceinline__ A divide_by(A a, int div) {
  if constexpr (std::is_integral<A>::value) {
    return static_cast<A>(static_cast<int64_t>(a) / static_cast<int64_t>(div));
  } else {
    return a / static_cast<A>(div);
  }
}

// ---- loads through L2 only (ld.global.cg) ----------------------------------------------------
// Workspace slots are rewritten by peers while a kernel runs; .cg never serves a stale L1 line.

__device__ __forceinline__ uint4 ldcg16(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

template <class T>
__device__ __forceinline__ T ldcg(const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "size");
  T out;
  if constexpr (sizeof(T) == 1) {
    const unsigned char v = __ldcg(reinterpret_cast<const unsigned char*>(p));
    memcpy(&out, &v, 1);
  } else if constexpr (sizeof(T) == 2) {
    const unsigned short v = __ldcg(reinterpret_cast<const unsigned short*>(p));
    memcpy(&out, &v, 2);
  } else if constexpr (sizeof(T) == 4) {
    const unsigned int v = __ldcg(reinterpret_cast<const unsigned int*>(p));
    memcpy(&out, &v, 4);
  } else {
    const unsigned long long v = __ldcg(reinterpret_cast<const unsigned long long*>(p));
    memcpy(&out, &v, 8);
  }
  return out;
}

// 16-byte pack <-> elements.
template <class T>
struct alignas(16) PackArray {
  T e[kPack<T>];
};

template <class T>
__device__ __forceinline__ PackArray<T> unpack(uint4 v) {
  PackArray<T> a;
  memcpy(&a, &v, 16);
  return a;
}
template <class T>
__device__ __forceinline__ uint4 pack(const PackArray<T>& a) {
  uint4 v;
  memcpy(&v, &a, 16);
  return v;
}

}  // namespace kernels
}  // namespace pycoll

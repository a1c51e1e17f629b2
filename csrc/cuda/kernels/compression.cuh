// CUDA kernels of gradient compression: signSGD sign packing, unpacking and
// majority vote; PowerSGD's batched Gram-Schmidt; the batched copy behind the
// fused bucketing calls. No torch here: compression.cu is the torch glue
// (checks, dtype switch, stream, launch check).
//
// The layouts and the results are those documented in cpu/kernels/compression.h
// (bit i % 32 of word i / 32 is 1 for a negative element; vote ties give 0;
// modified Gram-Schmidt with col /= |col| + eps), so that both engines agree
// bit for bit on the sign functions.
//
// Element types: float, double, __half, __nv_bfloat16. Arithmetic ("acc")
// is float, double for double.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/batched_copy.h"

namespace pycoll {
namespace kernels {
namespace compression {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_acc(typename AccOf<T>::type a);
template <>
__device__ __forceinline__ float from_acc<float>(float a) {
  return a;
}
template <>
__device__ __forceinline__ double from_acc<double>(double a) {
  return a;
}
template <>
__device__ __forceinline__ __half from_acc<__half>(float a) {
  return __float2half_rn(a);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float a) {
  return __float2bfloat16_rn(a);
}

// ---------------------------------------------------------------------------
// pack_signs
//
// Terms: a warp "span" is the 32 * V consecutive elements that one warp packs
// per step when each lane loads V elements as one 16-byte vector
// (V = 16 / sizeof(T)); the span becomes V words. Word k of the span takes
// its 32 bits from the G = 32 / V lanes k*G .. k*G + G-1, V bits each, which
// an OR-reduction over those G lanes (xor shuffles) assembles; lane k*G
// stores it. The elements after the last full span are packed one element
// per lane with __ballot_sync, one word per warp step.

template <typename T>
struct Vec16 {
  static constexpr int V = 16 / sizeof(T);
  T v[V];
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
    pack_signs_kernel(const T* __restrict__ x, uint32_t* __restrict__ out, int64_t numel, int64_t full_spans) {
  constexpr int V = Vec16<T>::V;
  constexpr int G = 32 / V;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int64_t nwarps = (int64_t)gridDim.x * kWarps;

  // Full spans, vectorised: x is 16-byte aligned (checked by the host).
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  for (int64_t s = warp; s < full_spans; s += nwarps) {
    uint4 raw = __ldg(xv + s * 32 + lane);
    const T* e = reinterpret_cast<const T*>(&raw);
    uint32_t bits = 0;
#pragma unroll
    for (int t = 0; t < V; ++t) bits |= static_cast<uint32_t>(to_acc(e[t]) < 0) << t;
    bits <<= V * (lane % G);
#pragma unroll
    for (int off = 1; off < G; off <<= 1) bits |= __shfl_xor_sync(kFullMask, bits, off);
    if (lane % G == 0) out[s * V + lane / G] = bits;
  }

  // The rest, one element per lane.
  const int64_t first_word = full_spans * V;
  const int64_t words = (numel + 31) / 32;
  for (int64_t w = first_word + warp; w < words; w += nwarps) {
    const int64_t i = w * 32 + lane;
    const bool neg = i < numel && to_acc(x[i]) < 0;
    const uint32_t bits = __ballot_sync(kFullMask, neg);
    if (lane == 0) out[w] = bits;
  }
}

// Scalar variant for inputs that are not 16-byte aligned.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    pack_signs_scalar_kernel(const T* __restrict__ x, uint32_t* __restrict__ out, int64_t numel) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int64_t nwarps = (int64_t)gridDim.x * kWarps;
  const int64_t words = (numel + 31) / 32;
  for (int64_t w = warp; w < words; w += nwarps) {
    const int64_t i = w * 32 + lane;
    const bool neg = i < numel && to_acc(x[i]) < 0;
    const uint32_t bits = __ballot_sync(kFullMask, neg);
    if (lane == 0) out[w] = bits;
  }
}

// ---------------------------------------------------------------------------
// unpack_signs and majority_vote: one "quad" (4 consecutive elements, one
// float4 store) per thread step; a quad's 4 bits sit in one word.

__device__ __forceinline__ float sign_value(uint32_t bit, float scale) { return bit ? -scale : scale; }

__global__ void __launch_bounds__(kThreads)
    unpack_signs_kernel(const uint32_t* __restrict__ packed, float* __restrict__ out, int64_t numel, float scale) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t nthreads = (int64_t)gridDim.x * blockDim.x;
  const int64_t quads = numel / 4;
  float4* out4 = reinterpret_cast<float4*>(out);
  for (int64_t q = tid; q < quads; q += nthreads) {
    const uint32_t bits = __ldg(packed + (q >> 3)) >> ((q & 7) * 4);
    out4[q] = make_float4(sign_value(bits & 1u, scale), sign_value(bits & 2u, scale), sign_value(bits & 4u, scale),
                          sign_value(bits & 8u, scale));
  }
  for (int64_t i = quads * 4 + tid; i < numel; i += nthreads) {
    out[i] = sign_value((__ldg(packed + (i >> 5)) >> (i & 31)) & 1u, scale);
  }
}

__device__ __forceinline__ float vote_value(int neg, int world, float scale) {
  return 2 * neg < world ? scale : (2 * neg > world ? -scale : 0.0f);
}

// gathered: world rows of `row` words each (row >= ceil(numel / 32)).
__global__ void __launch_bounds__(kThreads)
    majority_vote_kernel(const uint32_t* __restrict__ gathered, int world, int64_t row, float* __restrict__ out,
                         int64_t numel, float scale) {
  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t nthreads = (int64_t)gridDim.x * blockDim.x;
  const int64_t quads = numel / 4;
  float4* out4 = reinterpret_cast<float4*>(out);
  for (int64_t q = tid; q < quads; q += nthreads) {
    int n0 = 0, n1 = 0, n2 = 0, n3 = 0;
    for (int r = 0; r < world; ++r) {
      const uint32_t bits = __ldg(gathered + r * row + (q >> 3)) >> ((q & 7) * 4);
      n0 += bits & 1u;
      n1 += (bits >> 1) & 1u;
      n2 += (bits >> 2) & 1u;
      n3 += (bits >> 3) & 1u;
    }
    out4[q] = make_float4(vote_value(n0, world, scale), vote_value(n1, world, scale), vote_value(n2, world, scale),
                          vote_value(n3, world, scale));
  }
  for (int64_t i = quads * 4 + tid; i < numel; i += nthreads) {
    int neg = 0;
    for (int r = 0; r < world; ++r) neg += (__ldg(gathered + r * row + (i >> 5)) >> (i & 31)) & 1u;
    out[i] = vote_value(neg, world, scale);
  }
}

// ---------------------------------------------------------------------------
// batched Gram-Schmidt: one block per [n, r] matrix.
//
// Terms: for column i, a "window" is up to kWindow consecutive columns
// j0 .. j0 + kWindow - 1 (j0 >= i) whose sums sum_k x[k,i] * x[k,j] one pass
// over the rows computes; the window starting at i yields |col_i|^2 too. The
// sums go to shared memory (`dots`, r values), then a second pass normalises
// column i and removes it from columns i+1 .. r-1. Each thread owns the same
// rows in both passes, so only the shared reduction needs barriers. The
// reduction order is fixed: results are deterministic.

constexpr int kWindow = 8;

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) gram_schmidt_kernel(T* __restrict__ m, int64_t n, int r, int64_t sb,
                                                                int64_t sr, int64_t sc, typename AccOf<T>::type eps) {
  using A = typename AccOf<T>::type;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* dots = reinterpret_cast<A*>(smem_raw);  // r values
  __shared__ A partial[kWarps][kWindow];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  T* base = m + (int64_t)blockIdx.x * sb;

  for (int i = 0; i < r; ++i) {
    // Pass 1: dots[j] = <col_i, col_j> for j >= i, one window at a time.
    for (int j0 = i; j0 < r; j0 += kWindow) {
      A acc[kWindow];
#pragma unroll
      for (int t = 0; t < kWindow; ++t) acc[t] = A(0);
      for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        const T* row = base + k * sr;
        const A xi = to_acc(row[i * sc]);
#pragma unroll
        for (int t = 0; t < kWindow; ++t) {
          if (j0 + t < r) acc[t] += xi * to_acc(row[(j0 + t) * sc]);
        }
      }
#pragma unroll
      for (int t = 0; t < kWindow; ++t) {
        const A s = warp_sum(acc[t]);
        if (lane == 0) partial[warp][t] = s;
      }
      __syncthreads();
      if (warp == 0) {
#pragma unroll
        for (int t = 0; t < kWindow; ++t) {
          A s = lane < kWarps ? partial[lane][t] : A(0);
          s = warp_sum(s);
          if (lane == 0 && j0 + t < r) dots[j0 + t] = s;
        }
      }
      __syncthreads();  // dots visible; partial free for the next window
    }
    // Pass 2: normalise column i, remove it from the later columns.
    const A nrm2 = dots[i];
    const A inv = nrm2 > A(0) ? A(1) / (sqrt(nrm2) + eps) : A(0);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      T* row = base + k * sr;
      const T qi = from_acc<T>(to_acc(row[i * sc]) * inv);
      row[i * sc] = qi;
      const A q = to_acc(qi);
      for (int j = i + 1; j < r; ++j) row[j * sc] = from_acc<T>(to_acc(row[j * sc]) - dots[j] * inv * q);
    }
    __syncthreads();  // every thread has read dots before the next column overwrites it
  }
}

// ---------------------------------------------------------------------------
// batched copy: one block per chunk (common/batched_copy.h), 16-byte
// vectors when source, destination and length allow, else 4-byte words, else
// bytes. Each thread issues kUnroll loads before its stores, so that enough
// bytes are in flight to reach the memory bandwidth.

constexpr int kUnroll = 4;

template <typename V>
__device__ __forceinline__ void copy_words(const V* __restrict__ s, V* __restrict__ d, int64_t count) {
  int64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * blockDim.x < count; i += kUnroll * blockDim.x) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = s[i + u * blockDim.x];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) d[i + u * blockDim.x] = v[u];
  }
  for (; i < count; i += blockDim.x) d[i] = s[i];
}

__global__ void __launch_bounds__(kThreads) batched_copy_kernel(const CopyChunk* __restrict__ chunks) {
  const CopyChunk c = chunks[blockIdx.x];
  if (c.src == c.dst) return;
  const uintptr_t align =
      reinterpret_cast<uintptr_t>(c.src) | reinterpret_cast<uintptr_t>(c.dst) | static_cast<uintptr_t>(c.bytes);
  if ((align & 15) == 0) {
    copy_words(reinterpret_cast<const uint4*>(c.src), reinterpret_cast<uint4*>(c.dst), c.bytes / 16);
  } else if ((align & 3) == 0) {
    copy_words(reinterpret_cast<const uint32_t*>(c.src), reinterpret_cast<uint32_t*>(c.dst), c.bytes / 4);
  } else {
    copy_words(reinterpret_cast<const unsigned char*>(c.src), reinterpret_cast<unsigned char*>(c.dst), c.bytes);
  }
}

}  // namespace compression
}  // namespace kernels
}  // namespace pycoll

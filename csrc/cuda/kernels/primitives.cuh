// Block-wide data verbs: copy and reduce. Every thread of the CTA calls them with the same job
// (the job sits in shared memory, written by thread 0). They move data only; the flags around them
// are channel.cuh's business.
//
//   copy_run:   each job copies `bytes` from one source to up to kMaxRanks destinations. The width
//               is the widest of 16/8/4/2/1 bytes that every address of the job is aligned to
//               (tensors may start at odd offsets inside an allocation); the last bytes that do
//               not fill a word are copied one by one.
//   reduce_run: reduces `count` elements of `ns` sources in the listed order (the caller lists
//               them in rank order wherever bitwise identity depends on it) and stores the result
//               to `nd` destinations. 16-byte packs when every address is 16-byte aligned, one
//               element at a time otherwise and for the tail.
// Sources are read with ld.global.cg; destinations may be local or a peer's workspace (NVLink
// stores). Each element is read and written by the same thread, sources before destination, so a
// destination may alias a source (in-place collectives).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/vec.cuh"
#include "transport/cuda_ipc/layout.h"

namespace pycoll {
namespace kernels {

using cuda_ipc::kMaxRanks;

struct CopyJob {
  const char* src;
  char* dst[kMaxRanks];
  int32_t nd;
  int32_t pad;
  int64_t bytes;
};

struct ReduceJob {
  const void* src[kMaxRanks];
  void* dst[kMaxRanks];
  int32_t ns;
  int32_t nd;
  int32_t div;  // > 1: divide the final value (Avg)
  int32_t pad;
  int64_t count;  // elements
};

template <int W>
struct Word;
template <>
struct Word<16> {
  using type = uint4;
};
template <>
struct Word<8> {
  using type = unsigned long long;
};
template <>
struct Word<4> {
  using type = unsigned int;
};
template <>
struct Word<2> {
  using type = unsigned short;
};
template <>
struct Word<1> {
  using type = unsigned char;
};

// `tid` of `nt` threads run the job (the whole CTA unless a kernel splits it into warp roles).
template <int W>
__device__ __forceinline__ void copy_words(const CopyJob& job, int tid, int nt) {
  using V = typename Word<W>::type;
  constexpr int U = 8;  // independent loads in flight per thread
  const int nd = job.nd;
  const int64_t nw = job.bytes / W;
  const V* src = reinterpret_cast<const V*>(job.src);
  for (int64_t base = tid; base < nw; base += int64_t(U) * nt) {
    V v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t(u) * nt;
      if (i < nw) v[u] = __ldcg(src + i);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t(u) * nt;
      if (i < nw) {
        for (int d = 0; d < nd; ++d) reinterpret_cast<V*>(job.dst[d])[i] = v[u];
      }
    }
  }
  // Tail: bytes after the last whole word.
  for (int64_t i = nw * W + tid; i < job.bytes; i += nt) {
    const unsigned char c = __ldcg(reinterpret_cast<const unsigned char*>(job.src) + i);
    for (int d = 0; d < nd; ++d) reinterpret_cast<unsigned char*>(job.dst[d])[i] = c;
  }
}

static __device__ __noinline__ void copy_run(const CopyJob* jobs, int njobs, int tid, int nt) {
  for (int j = 0; j < njobs; ++j) {
    const CopyJob& job = jobs[j];
    if (job.bytes <= 0 || job.nd <= 0) continue;
    uintptr_t bits = reinterpret_cast<uintptr_t>(job.src);
    for (int d = 0; d < job.nd; ++d) bits |= reinterpret_cast<uintptr_t>(job.dst[d]);
    if ((bits & 15u) == 0) {
      copy_words<16>(job, tid, nt);
    } else if ((bits & 7u) == 0) {
      copy_words<8>(job, tid, nt);
    } else if ((bits & 3u) == 0) {
      copy_words<4>(job, tid, nt);
    } else if ((bits & 1u) == 0) {
      copy_words<2>(job, tid, nt);
    } else {
      copy_words<1>(job, tid, nt);
    }
  }
}

static __device__ __forceinline__ void copy_run(const CopyJob* jobs, int njobs) {
  copy_run(jobs, njobs, int(threadIdx.x), int(blockDim.x));
}

template <DType D, class Op>
__device__ __noinline__ void reduce_run(const ReduceJob* job) {
  using Tr = DTypeTraits<D>;
  using T = typename Tr::T;
  using A = typename Tr::Acc;
  constexpr int E = kPack<T>;
  // Packs in flight per thread and source: more spilled registers and ran slower.
  // docs/decisions/0004-split-one-shot.md
  constexpr int U = sizeof(T) == 1 ? 2 : 4;
  const int nt = blockDim.x;
  const int ns = job->ns;
  const int nd = job->nd;
  const int div = job->div;
  const int64_t count = job->count;
  if (count <= 0 || nd <= 0 || ns <= 0) return;

  uintptr_t bits = 0;
  for (int s = 0; s < ns; ++s) bits |= reinterpret_cast<uintptr_t>(job->src[s]);
  for (int d = 0; d < nd; ++d) bits |= reinterpret_cast<uintptr_t>(job->dst[d]);
  const int64_t nvec = (bits & 15u) ? 0 : count / E;

  for (int64_t base = threadIdx.x; base < nvec; base += int64_t(U) * nt) {
    A acc[U][E];
    {
      // The first two sources are loaded together (one memory latency, not two).
      const uint4* s0 = reinterpret_cast<const uint4*>(job->src[0]);
      const uint4* s1 = reinterpret_cast<const uint4*>(job->src[ns > 1 ? 1 : 0]);
      uint4 v0[U];
      uint4 v1[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = base + int64_t(u) * nt;
        v0[u] = i < nvec ? ldcg16(s0 + i) : make_uint4(0, 0, 0, 0);
        v1[u] = (i < nvec && ns > 1) ? ldcg16(s1 + i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const PackArray<T> x = unpack<T>(v0[u]);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[u][e] = Tr::to_acc(x.e[e]);
        if (ns > 1) {
          const PackArray<T> y = unpack<T>(v1[u]);
#pragma unroll
          for (int e = 0; e < E; ++e) acc[u][e] = Op::apply(acc[u][e], Tr::to_acc(y.e[e]));
        }
      }
    }
    for (int s = 2; s < ns; ++s) {
      const uint4* sp = reinterpret_cast<const uint4*>(job->src[s]);
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = base + int64_t(u) * nt;
        v[u] = i < nvec ? ldcg16(sp + i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const PackArray<T> x = unpack<T>(v[u]);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[u][e] = Op::apply(acc[u][e], Tr::to_acc(x.e[e]));
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + int64_t(u) * nt;
      if (i < nvec) {
        PackArray<T> y;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          A r = acc[u][e];
          if (div > 1) r = divide_by(r, div);
          y.e[e] = Tr::from_acc(r);
        }
        const uint4 out = pack<T>(y);
        for (int d = 0; d < nd; ++d) reinterpret_cast<uint4*>(job->dst[d])[i] = out;
      }
    }
  }

  // Elements after the last whole pack (or all of them when an address is not 16-byte aligned).
  for (int64_t i = nvec * E + threadIdx.x; i < count; i += nt) {
    A r = Tr::to_acc(ldcg(reinterpret_cast<const T*>(job->src[0]) + i));
    for (int s = 1; s < ns; ++s) {
      r = Op::apply(r, Tr::to_acc(ldcg(reinterpret_cast<const T*>(job->src[s]) + i)));
    }
    if (div > 1) r = divide_by(r, div);
    const T y = Tr::from_acc(r);
    for (int d = 0; d < nd; ++d) reinterpret_cast<T*>(job->dst[d])[i] = y;
  }
}

}  // namespace kernels
}  // namespace pycoll

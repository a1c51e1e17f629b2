// The chunk arithmetic and the plain step shared by the channel kernels (one_shot.cuh, two_shot.cuh,
// ring.cuh, tree.cuh, all_gather.cuh). Chunk c of a message goes to CTA c % B (B = gridDim.x), so
// CTA b's chunk k is chunk b + k*B; segment-based modes cut every segment the same way (args.h).
// Everything here is forced inline: a kernel compiles as if it had written the arithmetic itself.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/args.h"
#include "cuda/kernels/channel.cuh"

namespace pycoll {
namespace kernels {

// Where CTA blockIdx.x's chunk k of B starts, in the unit of `chunk` (elements or bytes).
__device__ __forceinline__ int64_t chunk_first(int64_t k, int B, int64_t chunk) {
  return (int64_t(blockIdx.x) + k * B) * chunk;
}

// The length of the chunk at `first` of a message of `total` units: `chunk`, or what is left.
__device__ __forceinline__ int64_t chunk_length(int64_t total, int64_t first, int64_t chunk) {
  return total - first < chunk ? total - first : chunk;
}

// A CTA's chunks of a ReduceArgs message (elements of a.elem_size bytes).
struct ReduceChunks {
  const ReduceArgs& a;
  const char* in;
  char* out;
  int64_t es;
  int B;

  __device__ __forceinline__ explicit ReduceChunks(const ReduceArgs& args)
      : a(args),
        in(static_cast<const char*>(args.in)),
        out(static_cast<char*>(args.out)),
        es(args.elem_size),
        B(gridDim.x) {}

  // How many chunks this CTA handles.
  __device__ __forceinline__ int64_t count() const { return block_chunk_count(a.nchunks, blockIdx.x, B); }
  // Chunk k's first element: in the whole tensor (one-shot, tree) or inside every segment.
  __device__ __forceinline__ int64_t first(int64_t k) const { return chunk_first(k, B, a.chunk); }
  // Whole-tensor modes: chunk k's elements (the last chunk may be short).
  __device__ __forceinline__ int64_t length(int64_t k) const { return chunk_length(a.count, first(k), a.chunk); }
  // Segment-based modes: the elements of segment q that chunk k covers,
  // clamp(clamp(count - q*seg, 0, seg) - first(k), 0, chunk); empty near the end.
  __device__ __forceinline__ int64_t slice(int q, int64_t k) const {
    int64_t seglen = a.count - int64_t(q) * a.seg;
    seglen = seglen < 0 ? 0 : (seglen > a.seg ? a.seg : seglen);
    const int64_t len = seglen - first(k);
    return len < 0 ? int64_t(0) : (len > a.chunk ? a.chunk : len);
  }
  // Slice (q, k) in the input and where its result goes.
  __device__ __forceinline__ const char* src(int q, int64_t k) const {
    return in + (int64_t(q) * a.seg + first(k)) * es;
  }
  __device__ __forceinline__ char* dst(int q, int64_t k) const {
    return out + (int64_t(q) * a.out_stride + first(k)) * es;
  }
};

// The ring prev -> me -> next of n ranks and its channel masks.
struct RingPeers {
  int n;
  int me;
  int prev;
  int next;
  uint32_t N;  // the outbound channel, to next
  uint32_t V;  // the inbound channel, from prev

  __device__ __forceinline__ explicit RingPeers(const DeviceHandle* h)
      : n(h->nranks), me(h->rank), prev((me - 1 + n) % n), next((me + 1) % n), N(1u << next), V(1u << prev) {}

  // The segment this rank works on at step j: (me - j) mod n.
  __device__ __forceinline__ int segment(int j) const { return ((me - j) % n + n) % n; }
};

// One step: acquire, thread 0 describes the jobs (sh->cjob / sh->rjob), every thread runs them
// (copy jobs only with kCopyOnly: execute_copy), release. False when a wait failed.
template <bool kCopyOnly, class Describe>
__device__ __forceinline__ bool run_step(BlockChannels& ch, StepShared* sh, uint32_t out_mask, uint32_t in_mask,
                                         Describe&& describe) {
  if (!ch.acquire(out_mask, in_mask)) return false;
  if (threadIdx.x == 0) {
    sh->clear();
    describe();
  }
  if constexpr (kCopyOnly) {
    ch.execute_copy(out_mask, in_mask);
  } else {
    ch.execute(out_mask, in_mask);
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

// Reduce-scatter: rank r ends with the reduction of segment r (in = nranks segments of m
// elements, out = m elements). Two algorithms, both the first half of an all-reduce:
//   direct: two_shot.cuh's scatter + reduce (one flag hop, every rank writes every peer);
//   ring:   ring.cuh's reduce-scatter half (n-1 hops, only prev -> me -> next).
// Bytes sent per rank: (n-1) * m * elem_size for both.
#pragma once

#include "cuda/kernels/ring.cuh"
#include "cuda/kernels/two_shot.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool reduce_scatter_direct(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  return direct_reduce_scatter(a, ch, sh, /*gather=*/false);
}

static __device__ bool reduce_scatter_ring(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  return ring_reduce_scatter(a, ch, sh, /*gather=*/false);
}

}  // namespace kernels
}  // namespace pycoll

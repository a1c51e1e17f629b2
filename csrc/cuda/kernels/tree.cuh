// Tree all-reduce, pipelined, over a double binary tree (NCCL's construction, computed on the
// host): CTAs with even index use tree 0 and odd ones tree 1, so each rank is an inner node in
// at most one of the trees and both link directions carry data. With 2 ranks it degenerates to
// tree 0 = (0 <- 1) and tree 1 = (1 <- 0).
//
//   chunk k of CTA b: elements [c*chunk, ...) of the whole tensor, c = b + k*B.
//   up(k):   wait for the children's partial sums of chunk k; reduce [mine, child0, child1]
//            (that fixed order); a non-root pushes the result to its parent; the root divides
//            (Avg), stores the final chunk to out and pushes it to its children.
//   down(k): non-root: wait for the final chunk from the parent, store it to out and push it to
//            the children.
//   Schedule (non-root): up(k) for every k, with down(k - L) after up(k); the last L downs at the
//   end. L < nslots makes it deadlock-free: any wait is for a message of an earlier chunk or of
//   the same chunk further up (up) or down (down) the tree.
//   The root computes each chunk once and everyone copies it, so every rank ends with the same bits.
//   Bytes sent per rank: about count * elem_size (a half up and a half down per tree).
#pragma once

#include "cuda/kernels/args.h"
#include "cuda/kernels/block_chunks.cuh"
#include "cuda/kernels/channel.cuh"

namespace pycoll {
namespace kernels {

constexpr int kTreeLag = 2;  // L above; must stay below the collective FIFO depth (4)

static __device__ bool tree_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  const int B = gridDim.x;
  const int t = B >= 2 ? int(blockIdx.x & 1u) : 0;
  const int parent = a.tree_parent[t];
  const int c0 = a.tree_child[t][0];
  const int c1 = a.tree_child[t][1];
  const uint32_t up_mask = parent >= 0 ? (1u << parent) : 0u;
  const uint32_t child_mask = (c0 >= 0 ? (1u << c0) : 0u) | (c1 >= 0 ? (1u << c1) : 0u);
  const bool root = parent < 0;
  const ReduceChunks c(a);
  const int64_t K = c.count();

  auto up = [&](int64_t k) {
    const uint32_t out_mask = root ? child_mask : up_mask;
    return run_step</*kCopyOnly=*/false>(ch, sh, out_mask, child_mask, [&] {
      ReduceJob& j = sh->set_reduce(c.length(k), root ? a.div : 1);
      push_src(j, c.in + c.first(k) * c.es);
      if (c0 >= 0) push_src(j, sh->islot[c0]);
      if (c1 >= 0) push_src(j, sh->islot[c1]);
      if (root) {
        push_dst(j, c.out + c.first(k) * c.es);
        if (c0 >= 0) push_dst(j, sh->oslot[c0]);
        if (c1 >= 0) push_dst(j, sh->oslot[c1]);
      } else {
        push_dst(j, sh->oslot[parent]);
      }
    });
  };
  auto down = [&](int64_t k) {
    return run_step</*kCopyOnly=*/false>(ch, sh, child_mask, up_mask, [&] {
      CopyJob& j = sh->add_copy(sh->islot[parent], c.length(k) * c.es);
      push_dst(j, c.out + c.first(k) * c.es);
      if (c0 >= 0) push_dst(j, sh->oslot[c0]);
      if (c1 >= 0) push_dst(j, sh->oslot[c1]);
    });
  };

  for (int64_t k = 0; k < K; ++k) {
    if (!up(k)) return false;
    if (!root && k >= kTreeLag && !down(k - kTreeLag)) return false;
  }
  if (!root) {
    for (int64_t k = K > kTreeLag ? K - kTreeLag : 0; k < K; ++k)
      if (!down(k)) return false;
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

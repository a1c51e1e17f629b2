// One-shot all-reduce: every rank pushes its whole input to every peer and reduces all n copies
// itself.
//
//   chunk k of CTA b: elements [c*chunk, min((c+1)*chunk, count)) with c = b + k*B.
//   push(k):   copy my chunk into the slot of channel me->p, for every peer p (NVLink stores).
//   reduce(k): wait for chunk k from every peer, reduce the n copies in rank order 0..n-1 (mine
//              read straight from `in`), store to `out`. Every rank runs the same operations on
//              the same values in the same order, so the result is bitwise identical everywhere.
//   Schedule: push(0), then for each k: push(k+1), reduce(k) — the next push is in flight while
//   this rank waits for the peers' copies.
//   One flag hop of latency; bytes sent per rank: (n-1) * count * elem_size.
#pragma once

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

template <DType D, class Op>
__device__ bool one_shot_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  using T = typename DTypeTraits<D>::T;
  const int n = sh->h.nranks;
  const int me = sh->h.rank;
  const uint32_t peers = peer_mask(n, me);
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  auto first = [&](int64_t k) { return (int64_t(blockIdx.x) + k * B) * a.chunk; };
  auto length = [&](int64_t k) {
    const int64_t f = first(k);
    return a.count - f < a.chunk ? a.count - f : a.chunk;
  };

  auto push = [&](int64_t k) -> bool {
    if (!ch.acquire(peers, 0)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      CopyJob& j = sh->add_copy(in + first(k), length(k) * int64_t(sizeof(T)));
      for (int p = 0; p < n; ++p)
        if (has(peers, p)) push_dst(j, sh->oslot[p]);
    }
    ch.execute<D, Op>(peers, 0);
    return true;
  };
  auto reduce = [&](int64_t k) -> bool {
    if (!ch.acquire(0, peers)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      ReduceJob& j = sh->set_reduce(length(k), a.div);
      for (int q = 0; q < n; ++q) push_src(j, q == me ? static_cast<const void*>(in + first(k)) : sh->islot[q]);
      push_dst(j, out + first(k));
    }
    ch.execute<D, Op>(0, peers);
    return true;
  };

  if (K > 0 && !push(0)) return false;
  for (int64_t k = 0; k < K; ++k) {
    if (k + 1 < K && !push(k + 1)) return false;
    if (!reduce(k)) return false;
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

// Two-shot all-reduce: a direct reduce-scatter followed by a direct all-gather. With
// gather = false the same code is the direct reduce-scatter (reduce_scatter.cuh).
//
//   segment q: clamp(count - q*seg, 0, seg) elements at in + q*seg; rank q owns segment q.
//   slice (q, k): the part of segment q that chunk k covers: offset first(k) = (b + k*B) * chunk
//                 inside the segment, length clamp(seglen(q) - first(k), 0, chunk). Slices may be
//                 empty near the end; an empty message is still sent so both ends stay in step.
//   scatter(k): for every peer p, push my slice (p, k) to p.
//   reduce(k):  wait for slice (me, k) from every peer, reduce the n slices in rank order (mine
//               from `in`), store to out + me*out_stride and, with gather, push the result to
//               every peer. Only the owner computes a segment, so every rank ends with the same bits.
//   gather(k):  wait for every peer's reduced slice (q, k), copy it to out + q*out_stride.
//   Schedule with gather:    scatter(0); for k: reduce(k), scatter(k+1), gather(k)
//                            (channel me->p then carries scatter(0), result(0), scatter(1), ... in
//                            the order p consumes them).
//   Schedule without gather: scatter(0); for k: scatter(k+1), reduce(k).
//   Two flag hops; bytes sent per rank: 2 * (n-1)/n * count * elem_size (half without gather).
#pragma once

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

template <DType D, class Op>
__device__ bool direct_reduce_scatter(const ReduceArgs& a, BlockChannels& ch, StepShared* sh, bool gather) {
  using T = typename DTypeTraits<D>::T;
  const int n = sh->h.nranks;
  const int me = sh->h.rank;
  const uint32_t peers = peer_mask(n, me);
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  auto first = [&](int64_t k) { return (int64_t(blockIdx.x) + k * B) * a.chunk; };
  auto slice = [&](int q, int64_t k) {
    int64_t seglen = a.count - int64_t(q) * a.seg;
    seglen = seglen < 0 ? 0 : (seglen > a.seg ? a.seg : seglen);
    const int64_t len = seglen - first(k);
    return len < 0 ? int64_t(0) : (len > a.chunk ? a.chunk : len);
  };
  auto src_of = [&](int q, int64_t k) { return in + int64_t(q) * a.seg + first(k); };
  auto dst_of = [&](int q, int64_t k) { return out + int64_t(q) * a.out_stride + first(k); };

  auto scatter = [&](int64_t k) -> bool {
    if (!ch.acquire(peers, 0)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      for (int p = 0; p < n; ++p) {
        if (!has(peers, p)) continue;
        CopyJob& j = sh->add_copy(src_of(p, k), slice(p, k) * int64_t(sizeof(T)));
        push_dst(j, sh->oslot[p]);
      }
    }
    ch.execute<D, Op>(peers, 0);
    return true;
  };
  auto reduce = [&](int64_t k) -> bool {
    const uint32_t out_mask = gather ? peers : 0u;
    if (!ch.acquire(out_mask, peers)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      ReduceJob& j = sh->set_reduce(slice(me, k), a.div);
      for (int q = 0; q < n; ++q) push_src(j, q == me ? static_cast<const void*>(src_of(me, k)) : sh->islot[q]);
      push_dst(j, dst_of(me, k));
      for (int p = 0; p < n; ++p)
        if (has(out_mask, p)) push_dst(j, sh->oslot[p]);
    }
    ch.execute<D, Op>(out_mask, peers);
    return true;
  };
  auto gather_recv = [&](int64_t k) -> bool {
    if (!ch.acquire(0, peers)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      for (int q = 0; q < n; ++q) {
        if (!has(peers, q)) continue;
        CopyJob& j = sh->add_copy(sh->islot[q], slice(q, k) * int64_t(sizeof(T)));
        push_dst(j, dst_of(q, k));
      }
    }
    ch.execute<D, Op>(0, peers);
    return true;
  };

  if (K > 0 && !scatter(0)) return false;
  for (int64_t k = 0; k < K; ++k) {
    if (gather) {
      if (!reduce(k)) return false;
      if (k + 1 < K && !scatter(k + 1)) return false;
      if (!gather_recv(k)) return false;
    } else {
      if (k + 1 < K && !scatter(k + 1)) return false;
      if (!reduce(k)) return false;
    }
  }
  return true;
}

template <DType D, class Op>
__device__ bool two_shot_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  return direct_reduce_scatter<D, Op>(a, ch, sh, /*gather=*/true);
}

}  // namespace kernels
}  // namespace pycoll

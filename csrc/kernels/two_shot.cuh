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
//   Schedule with gather:    scatter(0); for k: reduce(k); then gather(k) and scatter(k+1) in one
//                            step (channel me->p carries scatter(0), result(0), scatter(1), ...,
//                            the order p consumes them).
//   Schedule without gather: scatter(0); for k: reduce(k) and scatter(k+1) in one step.
//   A fused step waits for a message the peers sent in an earlier step and for a slot freed in an
//   earlier step, so no cycle of waits can form (needs nslots >= 2).
//   Two flag hops; bytes sent per rank: 2 * (n-1)/n * count * elem_size (half without gather).
#pragma once

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool direct_reduce_scatter(const ReduceArgs& a, BlockChannels& ch, StepShared* sh, bool gather) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const uint32_t peers = peer_mask(n, me);
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const int64_t es = a.elem_size;
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  auto first = [&](int64_t k) { return (int64_t(blockIdx.x) + k * B) * a.chunk; };
  auto slice = [&](int q, int64_t k) {
    int64_t seglen = a.count - int64_t(q) * a.seg;
    seglen = seglen < 0 ? 0 : (seglen > a.seg ? a.seg : seglen);
    const int64_t len = seglen - first(k);
    return len < 0 ? int64_t(0) : (len > a.chunk ? a.chunk : len);
  };
  auto src_of = [&](int q, int64_t k) { return in + (int64_t(q) * a.seg + first(k)) * es; };
  auto dst_of = [&](int q, int64_t k) { return out + (int64_t(q) * a.out_stride + first(k)) * es; };

  // Jobs of the current step (thread 0 only).
  auto add_scatter = [&](int64_t k) {
    for (int p = 0; p < n; ++p)
      if (has(peers, p)) push_dst(sh->add_copy(src_of(p, k), slice(p, k) * es), sh->oslot[p]);
  };
  auto add_reduce = [&](int64_t k, uint32_t result_to) {
    ReduceJob& j = sh->set_reduce(slice(me, k), a.div);
    for (int q = 0; q < n; ++q) push_src(j, q == me ? static_cast<const void*>(src_of(me, k)) : sh->islot[q]);
    push_dst(j, dst_of(me, k));
    for (int p = 0; p < n; ++p)
      if (has(result_to, p)) push_dst(j, sh->oslot[p]);
  };
  auto add_gather = [&](int64_t k) {
    for (int q = 0; q < n; ++q)
      if (has(peers, q)) push_dst(sh->add_copy(sh->islot[q], slice(q, k) * es), dst_of(q, k));
  };

  if (K > 0) {  // scatter(0)
    if (!ch.acquire(peers, 0)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      add_scatter(0);
    }
    ch.execute(peers, 0);
  }
  for (int64_t k = 0; k < K; ++k) {
    const bool more = k + 1 < K;
    if (gather) {
      // reduce(k): in from every peer, result out to every peer.
      if (!ch.acquire(peers, peers)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        add_reduce(k, peers);
      }
      ch.execute(peers, peers);
      // gather(k) + scatter(k+1).
      const uint32_t out_mask = more ? peers : 0u;
      if (!ch.acquire(out_mask, peers)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        add_gather(k);
        if (more) add_scatter(k + 1);
      }
      ch.execute(out_mask, peers);
    } else {
      // reduce(k) + scatter(k+1).
      const uint32_t out_mask = more ? peers : 0u;
      if (!ch.acquire(out_mask, peers)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        add_reduce(k, 0u);
        if (more) add_scatter(k + 1);
      }
      ch.execute(out_mask, peers);
    }
  }
  return true;
}

static __device__ bool two_shot_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  return direct_reduce_scatter(a, ch, sh, /*gather=*/true);
}

}  // namespace kernels
}  // namespace pycoll

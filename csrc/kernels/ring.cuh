// Ring all-reduce (and, with gather = false, ring reduce-scatter), pipelined through the
// bounded slots of the channel prev -> me -> next.
//
//   Segments and slices as in two_shot.cuh. s(j) = (me - j) mod n is the segment this rank works
//   on at step j. Per chunk k (NCCL's schedule):
//     send:               push my slice of segment s(1) to next
//     recvReduceSend:     j = 2..n-1: partial from prev + my slice of s(j) -> next
//     recvReduceCopySend: partial from prev + my slice of s(0) = me -> final; store to out and
//                         push to next (reduce-scatter: store only, no push)
//     recvCopySend:       j = 1..n-2: final slice of s(j) from prev -> out, and -> next
//     recv:               final slice of s(n-1) from prev -> out
//   Segment q is accumulated along the ring starting at rank q+1 and finished (Avg divided) at
//   rank q, the only rank that computes it, so every rank ends with the same bits.
//   Pipelining: the `send` of chunk k+1 is issued before the last receive of chunk k; messages
//   still leave in chunk order, which is the order `next` consumes them.
//   2(n-1) flag hops per chunk (n-1 without gather); bytes sent per rank:
//   2 * (n-1)/n * count * elem_size (half without gather).
#pragma once

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

template <DType D, class Op>
__device__ bool ring_reduce_scatter(const ReduceArgs& a, BlockChannels& ch, StepShared* sh, bool gather) {
  using T = typename DTypeTraits<D>::T;
  const int n = sh->h.nranks;
  const int me = sh->h.rank;
  const int prev = (me - 1 + n) % n;
  const int next = (me + 1) % n;
  const uint32_t N = 1u << next;
  const uint32_t V = 1u << prev;
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  auto s = [&](int j) { return ((me - j) % n + n) % n; };
  auto first = [&](int64_t k) { return (int64_t(blockIdx.x) + k * B) * a.chunk; };
  auto slice = [&](int q, int64_t k) {
    int64_t seglen = a.count - int64_t(q) * a.seg;
    seglen = seglen < 0 ? 0 : (seglen > a.seg ? a.seg : seglen);
    const int64_t len = seglen - first(k);
    return len < 0 ? int64_t(0) : (len > a.chunk ? a.chunk : len);
  };
  auto src_of = [&](int q, int64_t k) { return in + int64_t(q) * a.seg + first(k); };
  auto dst_of = [&](int q, int64_t k) { return out + int64_t(q) * a.out_stride + first(k); };

  auto send = [&](int64_t k) -> bool {
    if (!ch.acquire(N, 0)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      const int q = s(1);
      CopyJob& j = sh->add_copy(src_of(q, k), slice(q, k) * int64_t(sizeof(T)));
      push_dst(j, sh->oslot[next]);
    }
    ch.execute<D, Op>(N, 0);
    return true;
  };
  // Partial from prev combined with my slice of segment q; `final` divides and stores to out.
  auto recv_reduce = [&](int64_t k, int q, bool final, bool forward) -> bool {
    const uint32_t out_mask = forward ? N : 0u;
    if (!ch.acquire(out_mask, V)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      ReduceJob& j = sh->set_reduce(slice(q, k), final ? a.div : 1);
      push_src(j, sh->islot[prev]);
      push_src(j, src_of(q, k));
      if (final) push_dst(j, dst_of(q, k));
      if (forward) push_dst(j, sh->oslot[next]);
    }
    ch.execute<D, Op>(out_mask, V);
    return true;
  };
  auto recv_copy = [&](int64_t k, int q, bool forward) -> bool {
    const uint32_t out_mask = forward ? N : 0u;
    if (!ch.acquire(out_mask, V)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      CopyJob& j = sh->add_copy(sh->islot[prev], slice(q, k) * int64_t(sizeof(T)));
      push_dst(j, dst_of(q, k));
      if (forward) push_dst(j, sh->oslot[next]);
    }
    ch.execute<D, Op>(out_mask, V);
    return true;
  };

  if (K > 0 && !send(0)) return false;
  for (int64_t k = 0; k < K; ++k) {
    for (int j = 2; j <= n - 1; ++j)
      if (!recv_reduce(k, s(j), /*final=*/false, /*forward=*/true)) return false;
    if (gather) {
      if (!recv_reduce(k, me, /*final=*/true, /*forward=*/true)) return false;
      for (int j = 1; j <= n - 2; ++j)
        if (!recv_copy(k, s(j), /*forward=*/true)) return false;
      if (k + 1 < K && !send(k + 1)) return false;
      if (!recv_copy(k, s(n - 1), /*forward=*/false)) return false;
    } else {
      if (k + 1 < K && !send(k + 1)) return false;
      if (!recv_reduce(k, me, /*final=*/true, /*forward=*/false)) return false;
    }
  }
  return true;
}

template <DType D, class Op>
__device__ bool ring_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  return ring_reduce_scatter<D, Op>(a, ch, sh, /*gather=*/true);
}

}  // namespace kernels
}  // namespace pycoll

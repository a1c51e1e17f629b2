// Ring all-reduce (and, with gather = false, ring reduce-scatter), pipelined through the
// bounded slots of the channel prev -> me -> next.
//
//   Segments and slices as in two_shot.cuh. s(j) = (me - j) mod n (RingPeers::segment) is the segment this
//   rank works on at step j. Per chunk k (NCCL's schedule):
//     send:               push my slice of segment s(1) to next
//     recvReduceSend:     j = 2..n-1: partial from prev + my slice of s(j) -> next
//     recvReduceCopySend: partial from prev + my slice of s(0) = me -> final; store to out and
//                         push to next (reduce-scatter: store only, no push)
//     recvCopySend:       j = 1..n-2: final slice of s(j) from prev -> out, and -> next
//     recv:               final slice of s(n-1) from prev -> out
//   Segment q is accumulated along the ring starting at rank q+1 and finished (Avg divided) at
//   rank q, the only rank that computes it, so every rank ends with the same bits.
//   Pipelining: the `send` of chunk k+1 shares a step with the last receive of chunk k (one wait,
//   one fence); messages still leave in chunk order, which is the order `next` consumes them, and
//   a step only waits for messages and slots of earlier steps, so no cycle of waits can form.
//   2(n-1) flag hops per chunk (n-1 without gather); bytes sent per rank:
//   2 * (n-1)/n * count * elem_size (half without gather).
#pragma once

#include "cuda/kernels/args.h"
#include "cuda/kernels/block_chunks.cuh"
#include "cuda/kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool ring_reduce_scatter(const ReduceArgs& a, BlockChannels& ch, StepShared* sh, bool gather) {
  const RingPeers r(sh->h);
  const ReduceChunks c(a);
  const int64_t K = c.count();

  // Jobs of the current step (thread 0 only).
  auto add_send = [&](int64_t k) {
    const int q = r.segment(1);
    push_dst(sh->add_copy(c.src(q, k), c.slice(q, k) * c.es), sh->oslot[r.next]);
  };
  // Partial from prev combined with my slice of segment q; `final` divides and stores to out.
  auto add_recv_reduce = [&](int64_t k, int q, bool final, bool forward) {
    ReduceJob& j = sh->set_reduce(c.slice(q, k), final ? a.div : 1);
    push_src(j, sh->islot[r.prev]);
    push_src(j, c.src(q, k));
    if (final) push_dst(j, c.dst(q, k));
    if (forward) push_dst(j, sh->oslot[r.next]);
  };
  auto add_recv_copy = [&](int64_t k, int q, bool forward) {
    CopyJob& j = sh->add_copy(sh->islot[r.prev], c.slice(q, k) * c.es);
    push_dst(j, c.dst(q, k));
    if (forward) push_dst(j, sh->oslot[r.next]);
  };
  auto step = [&](uint32_t out_mask, uint32_t in_mask, auto&& describe) {
    return run_step</*kCopyOnly=*/false>(ch, sh, out_mask, in_mask, describe);
  };

  if (K > 0 && !step(r.N, 0u, [&] { add_send(0); })) return false;
  for (int64_t k = 0; k < K; ++k) {
    const bool more = k + 1 < K;
    const uint32_t send_next = more ? r.N : 0u;
    for (int j = 2; j <= r.n - 1; ++j)
      if (!step(r.N, r.V, [&] { add_recv_reduce(k, r.segment(j), /*final=*/false, /*forward=*/true); })) return false;
    if (gather) {
      if (!step(r.N, r.V, [&] { add_recv_reduce(k, r.me, /*final=*/true, /*forward=*/true); })) return false;
      for (int j = 1; j <= r.n - 2; ++j)
        if (!step(r.N, r.V, [&] { add_recv_copy(k, r.segment(j), /*forward=*/true); })) return false;
      // Last receive of chunk k + send of chunk k+1.
      if (!step(send_next, r.V, [&] {
            add_recv_copy(k, r.segment(r.n - 1), /*forward=*/false);
            if (more) add_send(k + 1);
          }))
        return false;
    } else {
      // Final reduce of chunk k + send of chunk k+1.
      if (!step(send_next, r.V, [&] {
            add_recv_reduce(k, r.me, /*final=*/true, /*forward=*/false);
            if (more) add_send(k + 1);
          }))
        return false;
    }
  }
  return true;
}

static __device__ bool ring_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  return ring_reduce_scatter(a, ch, sh, /*gather=*/true);
}

}  // namespace kernels
}  // namespace pycoll

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
//   Pipelining: the `send` of chunk k+1 shares a step with the last receive of chunk k (one wait,
//   one fence); messages still leave in chunk order, which is the order `next` consumes them, and
//   a step only waits for messages and slots of earlier steps, so no cycle of waits can form.
//   2(n-1) flag hops per chunk (n-1 without gather); bytes sent per rank:
//   2 * (n-1)/n * count * elem_size (half without gather).
#pragma once

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool ring_reduce_scatter(const ReduceArgs& a, BlockChannels& ch, StepShared* sh, bool gather) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const int prev = (me - 1 + n) % n;
  const int next = (me + 1) % n;
  const uint32_t N = 1u << next;
  const uint32_t V = 1u << prev;
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const int64_t es = a.elem_size;
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  auto s = [&](int j) { return ((me - j) % n + n) % n; };
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
  auto add_send = [&](int64_t k) {
    const int q = s(1);
    push_dst(sh->add_copy(src_of(q, k), slice(q, k) * es), sh->oslot[next]);
  };
  // Partial from prev combined with my slice of segment q; `final` divides and stores to out.
  auto add_recv_reduce = [&](int64_t k, int q, bool final, bool forward) {
    ReduceJob& j = sh->set_reduce(slice(q, k), final ? a.div : 1);
    push_src(j, sh->islot[prev]);
    push_src(j, src_of(q, k));
    if (final) push_dst(j, dst_of(q, k));
    if (forward) push_dst(j, sh->oslot[next]);
  };
  auto add_recv_copy = [&](int64_t k, int q, bool forward) {
    CopyJob& j = sh->add_copy(sh->islot[prev], slice(q, k) * es);
    push_dst(j, dst_of(q, k));
    if (forward) push_dst(j, sh->oslot[next]);
  };
  // One step: wait, let thread 0 describe the jobs, run them, release.
  auto step = [&](uint32_t out_mask, uint32_t in_mask, auto&& describe) -> bool {
    if (!ch.acquire(out_mask, in_mask)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      describe();
    }
    ch.execute(out_mask, in_mask);
    return true;
  };

  if (K > 0 && !step(N, 0u, [&] { add_send(0); })) return false;
  for (int64_t k = 0; k < K; ++k) {
    const bool more = k + 1 < K;
    const uint32_t send_next = more ? N : 0u;
    for (int j = 2; j <= n - 1; ++j)
      if (!step(N, V, [&] { add_recv_reduce(k, s(j), /*final=*/false, /*forward=*/true); })) return false;
    if (gather) {
      if (!step(N, V, [&] { add_recv_reduce(k, me, /*final=*/true, /*forward=*/true); })) return false;
      for (int j = 1; j <= n - 2; ++j)
        if (!step(N, V, [&] { add_recv_copy(k, s(j), /*forward=*/true); })) return false;
      // Last receive of chunk k + send of chunk k+1.
      if (!step(send_next, V, [&] {
            add_recv_copy(k, s(n - 1), /*forward=*/false);
            if (more) add_send(k + 1);
          }))
        return false;
    } else {
      // Final reduce of chunk k + send of chunk k+1.
      if (!step(send_next, V, [&] {
            add_recv_reduce(k, me, /*final=*/true, /*forward=*/false);
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

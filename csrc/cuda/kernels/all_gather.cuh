// All-gather: out = concatenation of every rank's `in` (`bytes` each), rank order.
//
//   chunk k of CTA b: bytes [c*chunk, min((c+1)*chunk, bytes)) of every rank's block, c = b + k*B.
//   direct: push(k): copy my chunk to out + me*bytes and into channel me->p for every peer p;
//           recv(k): copy chunk k of every peer q from its slot to out + q*bytes.
//           Schedule push(0); for k: recv(k) and push(k+1) in one step. One flag hop; bytes
//           sent per rank: (n-1) * bytes.
//   ring:   send(k): my chunk -> out and next; recvCopySend, j = 1..n-2: block s(j) = me - j from
//           prev -> out and next; recv: block s(n-1) from prev -> out, in one step with send(k+1).
//           n-1 hops, same bytes as direct, only prev -> me -> next links used.
//   Fused steps only wait for messages and slots of earlier steps (no cycle of waits).
#pragma once

#include "cuda/kernels/args.h"
#include "cuda/kernels/block_chunks.cuh"
#include "cuda/kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool all_gather_direct(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const uint32_t peers = peer_mask(n, me);
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);

  auto add_push = [&](int64_t k) {
    const int64_t f = chunk_first(k, B, a.chunk);
    CopyJob& j = sh->add_copy(in + f, chunk_length(a.bytes, f, a.chunk));
    push_dst(j, out + int64_t(me) * a.bytes + f);
    for (int p = 0; p < n; ++p)
      if (has(peers, p)) push_dst(j, sh->oslot[p]);
  };
  auto add_recv = [&](int64_t k) {
    const int64_t f = chunk_first(k, B, a.chunk);
    for (int q = 0; q < n; ++q)
      if (has(peers, q))
        push_dst(sh->add_copy(sh->islot[q], chunk_length(a.bytes, f, a.chunk)), out + int64_t(q) * a.bytes + f);
  };

  if (K > 0 && !run_step</*kCopyOnly=*/true>(ch, sh, peers, 0u, [&] { add_push(0); })) return false;  // push(0)
  for (int64_t k = 0; k < K; ++k) {  // recv(k) + push(k+1)
    const uint32_t out_mask = k + 1 < K ? peers : 0u;
    if (!run_step</*kCopyOnly=*/true>(ch, sh, out_mask, peers, [&] {
          add_recv(k);
          if (k + 1 < K) add_push(k + 1);
        }))
      return false;
  }
  return true;
}

static __device__ bool all_gather_ring(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const RingPeers r(sh->h);
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);

  auto add_send = [&](int64_t k) {
    const int64_t f = chunk_first(k, B, a.chunk);
    CopyJob& j = sh->add_copy(in + f, chunk_length(a.bytes, f, a.chunk));
    push_dst(j, out + int64_t(r.me) * a.bytes + f);
    push_dst(j, sh->oslot[r.next]);
  };
  auto add_recv_copy = [&](int64_t k, int q, bool forward) {
    const int64_t f = chunk_first(k, B, a.chunk);
    CopyJob& j = sh->add_copy(sh->islot[r.prev], chunk_length(a.bytes, f, a.chunk));
    push_dst(j, out + int64_t(q) * a.bytes + f);
    if (forward) push_dst(j, sh->oslot[r.next]);
  };
  auto step = [&](uint32_t out_mask, uint32_t in_mask, auto&& describe) {
    return run_step</*kCopyOnly=*/true>(ch, sh, out_mask, in_mask, describe);
  };

  if (K > 0 && !step(r.N, 0u, [&] { add_send(0); })) return false;
  for (int64_t k = 0; k < K; ++k) {
    const bool more = k + 1 < K;
    for (int j = 1; j <= r.n - 2; ++j)
      if (!step(r.N, r.V, [&] { add_recv_copy(k, r.segment(j), /*forward=*/true); })) return false;
    if (!step(more ? r.N : 0u, r.V, [&] {
          add_recv_copy(k, r.segment(r.n - 1), /*forward=*/false);
          if (more) add_send(k + 1);
        }))
      return false;
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

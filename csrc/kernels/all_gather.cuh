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

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

__device__ __forceinline__ int64_t copy_chunk_len(const CopyArgs& a, int64_t first) {
  return a.bytes - first < a.chunk ? a.bytes - first : a.chunk;
}

static __device__ bool all_gather_direct(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const uint32_t peers = peer_mask(n, me);
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  auto first = [&](int64_t k) { return (int64_t(blockIdx.x) + k * B) * a.chunk; };

  auto add_push = [&](int64_t k) {
    const int64_t f = first(k);
    CopyJob& j = sh->add_copy(in + f, copy_chunk_len(a, f));
    push_dst(j, out + int64_t(me) * a.bytes + f);
    for (int p = 0; p < n; ++p)
      if (has(peers, p)) push_dst(j, sh->oslot[p]);
  };
  auto add_recv = [&](int64_t k) {
    const int64_t f = first(k);
    for (int q = 0; q < n; ++q)
      if (has(peers, q)) push_dst(sh->add_copy(sh->islot[q], copy_chunk_len(a, f)), out + int64_t(q) * a.bytes + f);
  };

  if (K > 0) {  // push(0)
    if (!ch.acquire(peers, 0)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      add_push(0);
    }
    ch.execute_copy(peers, 0);
  }
  for (int64_t k = 0; k < K; ++k) {  // recv(k) + push(k+1)
    const uint32_t out_mask = k + 1 < K ? peers : 0u;
    if (!ch.acquire(out_mask, peers)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      add_recv(k);
      if (k + 1 < K) add_push(k + 1);
    }
    ch.execute_copy(out_mask, peers);
  }
  return true;
}

static __device__ bool all_gather_ring(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const int prev = (me - 1 + n) % n;
  const int next = (me + 1) % n;
  const uint32_t N = 1u << next;
  const uint32_t V = 1u << prev;
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  auto s = [&](int j) { return ((me - j) % n + n) % n; };
  auto first = [&](int64_t k) { return (int64_t(blockIdx.x) + k * B) * a.chunk; };

  auto add_send = [&](int64_t k) {
    const int64_t f = first(k);
    CopyJob& j = sh->add_copy(in + f, copy_chunk_len(a, f));
    push_dst(j, out + int64_t(me) * a.bytes + f);
    push_dst(j, sh->oslot[next]);
  };
  auto add_recv_copy = [&](int64_t k, int q, bool forward) {
    const int64_t f = first(k);
    CopyJob& j = sh->add_copy(sh->islot[prev], copy_chunk_len(a, f));
    push_dst(j, out + int64_t(q) * a.bytes + f);
    if (forward) push_dst(j, sh->oslot[next]);
  };
  auto step = [&](uint32_t out_mask, uint32_t in_mask, auto&& describe) -> bool {
    if (!ch.acquire(out_mask, in_mask)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      describe();
    }
    ch.execute_copy(out_mask, in_mask);
    return true;
  };

  if (K > 0 && !step(N, 0u, [&] { add_send(0); })) return false;
  for (int64_t k = 0; k < K; ++k) {
    const bool more = k + 1 < K;
    for (int j = 1; j <= n - 2; ++j)
      if (!step(N, V, [&] { add_recv_copy(k, s(j), /*forward=*/true); })) return false;
    if (!step(more ? N : 0u, V, [&] {
          add_recv_copy(k, s(n - 1), /*forward=*/false);
          if (more) add_send(k + 1);
        }))
      return false;
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

// All-gather: out = concatenation of every rank's `in` (`bytes` each), rank order.
//
//   chunk k of CTA b: bytes [c*chunk, min((c+1)*chunk, bytes)) of every rank's block, c = b + k*B.
//   direct: push(k): copy my chunk to out + me*bytes and into channel me->p for every peer p;
//           recv(k): copy chunk k of every peer q from its slot to out + q*bytes.
//           Schedule push(0); for k: push(k+1), recv(k). One flag hop; bytes sent per rank:
//           (n-1) * bytes.
//   ring:   send(k): my chunk -> out and next; recvCopySend, j = 1..n-2: block s(j) = me - j from
//           prev -> out and next; recv: block s(n-1) from prev -> out. n-1 hops, same bytes as
//           direct, only prev -> me -> next links used.
#pragma once

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

__device__ __forceinline__ int64_t copy_chunk_len(const CopyArgs& a, int64_t first) {
  return a.bytes - first < a.chunk ? a.bytes - first : a.chunk;
}

static __device__ bool all_gather_direct(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h.nranks;
  const int me = sh->h.rank;
  const uint32_t peers = peer_mask(n, me);
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  auto first = [&](int64_t k) { return (int64_t(blockIdx.x) + k * B) * a.chunk; };

  auto push = [&](int64_t k) -> bool {
    if (!ch.acquire(peers, 0)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      const int64_t f = first(k);
      CopyJob& j = sh->add_copy(in + f, copy_chunk_len(a, f));
      push_dst(j, out + int64_t(me) * a.bytes + f);
      for (int p = 0; p < n; ++p)
        if (has(peers, p)) push_dst(j, sh->oslot[p]);
    }
    ch.execute_copy(peers, 0);
    return true;
  };
  auto recv = [&](int64_t k) -> bool {
    if (!ch.acquire(0, peers)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      const int64_t f = first(k);
      for (int q = 0; q < n; ++q) {
        if (!has(peers, q)) continue;
        CopyJob& j = sh->add_copy(sh->islot[q], copy_chunk_len(a, f));
        push_dst(j, out + int64_t(q) * a.bytes + f);
      }
    }
    ch.execute_copy(0, peers);
    return true;
  };

  if (K > 0 && !push(0)) return false;
  for (int64_t k = 0; k < K; ++k) {
    if (k + 1 < K && !push(k + 1)) return false;
    if (!recv(k)) return false;
  }
  return true;
}

static __device__ bool all_gather_ring(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h.nranks;
  const int me = sh->h.rank;
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

  auto send = [&](int64_t k) -> bool {
    if (!ch.acquire(N, 0)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      const int64_t f = first(k);
      CopyJob& j = sh->add_copy(in + f, copy_chunk_len(a, f));
      push_dst(j, out + int64_t(me) * a.bytes + f);
      push_dst(j, sh->oslot[next]);
    }
    ch.execute_copy(N, 0);
    return true;
  };
  auto recv_copy = [&](int64_t k, int q, bool forward) -> bool {
    const uint32_t out_mask = forward ? N : 0u;
    if (!ch.acquire(out_mask, V)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      const int64_t f = first(k);
      CopyJob& j = sh->add_copy(sh->islot[prev], copy_chunk_len(a, f));
      push_dst(j, out + int64_t(q) * a.bytes + f);
      if (forward) push_dst(j, sh->oslot[next]);
    }
    ch.execute_copy(out_mask, V);
    return true;
  };

  if (K > 0 && !send(0)) return false;
  for (int64_t k = 0; k < K; ++k) {
    for (int j = 1; j <= n - 2; ++j)
      if (!recv_copy(k, s(j), /*forward=*/true)) return false;
    if (k + 1 < K && !send(k + 1)) return false;
    if (!recv_copy(k, s(n - 1), /*forward=*/false)) return false;
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

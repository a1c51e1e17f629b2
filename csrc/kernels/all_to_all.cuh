// All-to-all with per-peer byte counts and offsets (in and out viewed as bytes).
//
//   pair (me -> p): send_bytes[p] bytes at in + send_off[p], cut into chunks of `chunk` bytes (the
//   slot size); chunk j goes through CTA j % B, B = gridDim.x, a constant of this mode so that both
//   ends of a pair agree on the mapping whatever their other pairs carry.
//   self:    my own slice is copied locally, split evenly over the CTAs.
//   send(k): for every peer p that has a chunk j = b + k*B, copy it into channel me->p.
//   recv(k): for every peer q that sent a chunk j, copy it from the slot to out + recv_off[q] + j*chunk.
//   Schedule send(0); for k: recv(k) and send(k+1) in one step (it waits only for messages and
//   slots of earlier steps). Pairs with nothing to carry cost nothing.
//   Bytes sent per rank: sum of send_bytes over peers.
#pragma once

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool all_to_all(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const uint32_t peers = peer_mask(n, me);
  const int B = gridDim.x;
  const int b = blockIdx.x;
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  const int64_t chunk = a.chunk;

  // Own slice.
  {
    const int64_t self = a.send_bytes[me];
    const int64_t per = ((self + B - 1) / B + 15) / 16 * 16;
    const int64_t f = int64_t(b) * per;
    const int64_t len = self - f < per ? self - f : per;
    if (threadIdx.x == 0) {
      sh->clear();
      if (len > 0) push_dst(sh->add_copy(in + a.send_off[me] + f, len), out + a.recv_off[me] + f);
    }
    __syncthreads();
    copy_run(sh->cjob, sh->njobs);
    __syncthreads();
  }

  auto chunks = [&](int64_t bytes) { return (bytes + chunk - 1) / chunk; };
  int64_t K = 0;
  for (int p = 0; p < n; ++p) {
    if (!has(peers, p)) continue;
    const int64_t ks = block_chunk_count(chunks(a.send_bytes[p]), b, B);
    const int64_t kr = block_chunk_count(chunks(a.recv_bytes[p]), b, B);
    K = ks > K ? ks : K;
    K = kr > K ? kr : K;
  }

  // Peers that exchange chunk j = b + k*B of their pair with this rank.
  auto send_mask = [&](int64_t k) {
    const int64_t j = int64_t(b) + k * B;
    uint32_t mask = 0;
    for (int p = 0; p < n; ++p)
      if (has(peers, p) && j < chunks(a.send_bytes[p])) mask |= 1u << p;
    return mask;
  };
  auto recv_mask = [&](int64_t k) {
    const int64_t j = int64_t(b) + k * B;
    uint32_t mask = 0;
    for (int q = 0; q < n; ++q)
      if (has(peers, q) && j < chunks(a.recv_bytes[q])) mask |= 1u << q;
    return mask;
  };
  auto add_send = [&](int64_t k, uint32_t mask) {
    const int64_t f = (int64_t(b) + k * B) * chunk;
    for (int p = 0; p < n; ++p) {
      if (!has(mask, p)) continue;
      const int64_t len = a.send_bytes[p] - f < chunk ? a.send_bytes[p] - f : chunk;
      push_dst(sh->add_copy(in + a.send_off[p] + f, len), sh->oslot[p]);
    }
  };
  auto add_recv = [&](int64_t k, uint32_t mask) {
    const int64_t f = (int64_t(b) + k * B) * chunk;
    for (int q = 0; q < n; ++q) {
      if (!has(mask, q)) continue;
      const int64_t len = a.recv_bytes[q] - f < chunk ? a.recv_bytes[q] - f : chunk;
      push_dst(sh->add_copy(sh->islot[q], len), out + a.recv_off[q] + f);
    }
  };

  for (int64_t k = -1; k < K; ++k) {  // step k: recv(k) (k >= 0) + send(k+1)
    const uint32_t in_mask = k >= 0 ? recv_mask(k) : 0u;
    const uint32_t out_mask = k + 1 < K ? send_mask(k + 1) : 0u;
    if (in_mask == 0 && out_mask == 0) continue;
    if (!ch.acquire(out_mask, in_mask)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      add_recv(k, in_mask);
      add_send(k + 1, out_mask);
    }
    ch.execute_copy(out_mask, in_mask);
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

// All-to-all with per-peer byte counts and offsets (in and out viewed as bytes).
//
//   Every CTA serves one side of one pair: C = gridDim.x / 2 slots, the n-1 pairs of this rank
//   get Cp = C / (n-1) channels each; CTA 2i sends on channel i / (n-1) to the (i mod (n-1))-th
//   peer after this rank, CTA 2i+1 receives on it from the (i mod (n-1))-th peer before it.
//   So a rank's copies into its peers' slots never wait behind the copies out of its own, and a
//   slow peer holds up only its own CTAs (docs/decisions/0011-p2p-channels.md). Senders and
//   receivers alternate so that a grid only partly resident still has both sides of a pair.
//   pair (me -> p): send_bytes[p] bytes at in + send_off[p], cut into chunks of `chunk` bytes (the
//   slot size); chunk j goes through channel j % Cp, Cp a constant of the engine and the world
//   size, so that both ends of a pair agree on the mapping whatever their other pairs carry.
//   self:  my own slice is copied locally by the receiving CTAs (odd blockIdx), split evenly among
//          them, a piece after each chunk they receive (the rest after their last): a receiver
//          mostly waits for NVLink, so the local copy runs in that idle time rather than ahead of
//          every transfer (on 2 H200 at 1 GiB it took 0.27 of the kernel's 1.76 ms when it ran first).
//   Pairs with nothing to carry cost nothing. Bytes sent per rank: sum of send_bytes over peers.
#pragma once

#include "cuda/kernels/all_to_all_role.h"
#include "cuda/kernels/args.h"
#include "cuda/kernels/channel.cuh"

namespace pycoll {
namespace kernels {

// One piece of the own slice, by the whole CTA (every thread calls it).
static __device__ void copy_own_piece(StepShared* sh, const char* src, char* dst, int64_t len) {
  if (threadIdx.x == 0) {
    sh->clear();
    if (len > 0) push_dst(sh->add_copy(src, len), dst);
  }
  __syncthreads();
  copy_run(sh->cjob, sh->njobs);
  __syncthreads();
}

static __device__ bool all_to_all(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const AllToAllRole role = all_to_all_role(n, me, int(gridDim.x), int(blockIdx.x));
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  const int64_t chunk = a.chunk;

  // This CTA's share of the own slice: the receiving CTAs (odd blockIdx) split it evenly.
  const int copiers = int(gridDim.x) / 2;
  const bool copier = (blockIdx.x % 2) == 1;
  const int64_t self = a.send_bytes[me];
  const int64_t per = ((self + copiers - 1) / copiers + 15) / 16 * 16;
  const int64_t own_from = copier ? (int64_t(blockIdx.x) / 2) * per : self;
  const int64_t own_len = own_from < self ? (self - own_from < per ? self - own_from : per) : 0;
  const char* own_src = in + a.send_off[me] + own_from;
  char* own_dst = out + a.recv_off[me] + own_from;

  const int p = role.peer;
  const int64_t bytes = p < 0 ? 0 : (role.sender ? a.send_bytes[p] : a.recv_bytes[p]);
  const int64_t off = p < 0 ? 0 : (role.sender ? a.send_off[p] : a.recv_off[p]);
  const int64_t K = p < 0 ? 0 : block_chunk_count((bytes + chunk - 1) / chunk, role.chan, role.channels);
  // The own share in one piece per received chunk (at least one piece).
  const int64_t pieces = K > 0 ? K : 1;
  const int64_t piece = ((own_len + pieces - 1) / pieces + 15) / 16 * 16;
  int64_t own_done = 0;
  auto own_next = [&]() {
    const int64_t len = own_len - own_done < piece ? own_len - own_done : piece;
    if (len > 0) copy_own_piece(sh, own_src + own_done, own_dst + own_done, len);
    own_done += len > 0 ? len : 0;
  };

  if (p >= 0) {
    const uint32_t mask = 1u << p;
    const uint32_t out_mask = role.sender ? mask : 0u;
    const uint32_t in_mask = role.sender ? 0u : mask;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t f = (int64_t(role.chan) + k * role.channels) * chunk;
      const int64_t len = bytes - f < chunk ? bytes - f : chunk;
      if (!ch.acquire(out_mask, in_mask)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        if (role.sender) {
          push_dst(sh->add_copy(in + off + f, len), sh->oslot[p]);
        } else {
          push_dst(sh->add_copy(sh->islot[p], len), out + off + f);
        }
      }
      ch.execute_copy(out_mask, in_mask);
      if (copier) own_next();
    }
  }
  while (own_done < own_len) own_next();
  return true;
}

}  // namespace kernels
}  // namespace pycoll

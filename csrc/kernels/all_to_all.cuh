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
//   self:  my own slice is copied locally, split evenly over all CTAs.
//   Pairs with nothing to carry cost nothing. Bytes sent per rank: sum of send_bytes over peers.
#pragma once

#include "kernels/all_to_all_role.h"
#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool all_to_all(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const AllToAllRole role = all_to_all_role(n, me, int(gridDim.x), int(blockIdx.x));
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  const int64_t chunk = a.chunk;

  // Own slice, over every CTA.
  {
    const int64_t self = a.send_bytes[me];
    const int B = int(gridDim.x);
    const int64_t per = ((self + B - 1) / B + 15) / 16 * 16;
    const int64_t f = int64_t(blockIdx.x) * per;
    const int64_t len = self - f < per ? self - f : per;
    if (threadIdx.x == 0) {
      sh->clear();
      if (len > 0) push_dst(sh->add_copy(in + a.send_off[me] + f, len), out + a.recv_off[me] + f);
    }
    __syncthreads();
    copy_run(sh->cjob, sh->njobs);
    __syncthreads();
  }
  if (role.peer < 0) return true;

  const int p = role.peer;
  const uint32_t mask = 1u << p;
  const uint32_t out_mask = role.sender ? mask : 0u;
  const uint32_t in_mask = role.sender ? 0u : mask;
  const int64_t bytes = role.sender ? a.send_bytes[p] : a.recv_bytes[p];
  const int64_t off = role.sender ? a.send_off[p] : a.recv_off[p];
  const int64_t K = block_chunk_count((bytes + chunk - 1) / chunk, role.chan, role.channels);
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
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

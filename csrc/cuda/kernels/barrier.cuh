// Device-side barrier: one CTA posts an empty message to every peer, then waits for one from
// every peer. When a rank's barrier kernel completes, every peer's barrier kernel has started,
// and everything those peers enqueued before it on the same stream has completed.
#pragma once

#include "cuda/kernels/args.h"
#include "cuda/kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool barrier_all(BlockChannels& ch, StepShared* sh) {
  const uint32_t peers = peer_mask(sh->h->nranks, sh->h->rank);
  if (!ch.acquire(peers, 0)) return false;
  if (threadIdx.x == 0) sh->clear();
  ch.execute_copy(peers, 0);
  if (!ch.acquire(0, peers)) return false;
  if (threadIdx.x == 0) sh->clear();
  ch.execute_copy(0, peers);
  return true;
}

}  // namespace kernels
}  // namespace pycoll

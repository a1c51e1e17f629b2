// One-shot all-reduce: every rank pushes its whole input to every peer and reduces all n copies
// itself.
//
//   chunk k of CTA b: elements [c*chunk, min((c+1)*chunk, count)) with c = b + k*B.
//   push(k):   copy my chunk into the slot of channel me->p, for every peer p (NVLink stores).
//   reduce(k): wait for chunk k from every peer, reduce the n copies in rank order 0..n-1 (mine
//              read straight from `in`), store to `out`. Every rank runs the same operations on
//              the same values in the same order, so the result is bitwise identical everywhere.
//   Schedule: push(0), then for each k one step that does reduce(k) and push(k+1) together (one
//   wait, one fence): the next chunk is in flight while this one is reduced. A step waits only for
//   messages the peers sent in earlier steps, so the ranks cannot wait on each other in a cycle.
//   One flag hop of latency; bytes sent per rank: (n-1) * count * elem_size.
#pragma once

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool one_shot_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const uint32_t peers = peer_mask(n, me);
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const int64_t es = a.elem_size;
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  auto first = [&](int64_t k) { return (int64_t(blockIdx.x) + k * B) * a.chunk; };
  auto length = [&](int64_t k) {
    const int64_t f = first(k);
    return a.count - f < a.chunk ? a.count - f : a.chunk;
  };

  // Copies of chunk k to every peer, as a job of the current step.
  auto add_push = [&](int64_t k) {
    CopyJob& j = sh->add_copy(in + first(k) * es, length(k) * es);
    for (int p = 0; p < n; ++p)
      if (has(peers, p)) push_dst(j, sh->oslot[p]);
  };

  if (K > 0) {  // push(0)
    if (!ch.acquire(peers, 0)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      add_push(0);
    }
    ch.execute(peers, 0);
  }
  for (int64_t k = 0; k < K; ++k) {  // reduce(k) + push(k+1)
    const uint32_t out_mask = k + 1 < K ? peers : 0u;
    if (!ch.acquire(out_mask, peers)) return false;
    if (threadIdx.x == 0) {
      sh->clear();
      ReduceJob& j = sh->set_reduce(length(k), a.div);
      for (int q = 0; q < n; ++q) push_src(j, q == me ? static_cast<const void*>(in + first(k) * es) : sh->islot[q]);
      push_dst(j, out + first(k) * es);
      if (k + 1 < K) add_push(k + 1);
    }
    ch.execute(out_mask, peers);
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

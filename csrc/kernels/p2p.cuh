// Point-to-point copy on the p2p channel set (separate slots and counters from collectives, so a
// send/recv may run on another stream while a collective runs).
//
//   Message of `bytes` to/from `peer`, cut into `nchunks` chunks of at most a slot; chunk j goes
//   through CTA j % blocks. Both ends derive chunk and blocks from the message length
//   (gpu::plan_p2p), so they agree; when the lengths differ, the first chunk of CTA 0 carries the
//   mismatch to the receiver.
//   send: wait for a free slot of channel me->peer, copy the chunk in, post it with the total
//         message length beside it.
//   recv: wait for the chunk, check the sender's total length against ours (kErrSizeMismatch),
//         copy it out, free the slot.
//   Messages between one pair are matched in issue order. A send waits for the receiver once a
//   channel it uses holds kP2PSlots unconsumed chunks: a message of more than that many chunks per
//   CTA, or any send behind unreceived ones (channel 0 carries a chunk of every message). It then
//   needs the matching recv to run concurrently (the backend issues sends and receives on
//   different streams), and two opposite sends drain each other's channels without deadlock.
#pragma once

#include "kernels/args.h"
#include "kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool p2p_run(const P2PArgs& a, BlockChannels& ch, StepShared* sh) {
  const uint32_t m = 1u << a.peer;
  const int B = a.blocks;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  char* buf = static_cast<char*>(a.buf);
  for (int64_t k = 0; k < K; ++k) {
    const int64_t f = (int64_t(blockIdx.x) + k * B) * a.chunk;
    const int64_t len = a.bytes - f < a.chunk ? a.bytes - f : a.chunk;
    if (a.is_send) {
      if (!ch.acquire(m, 0)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        push_dst(sh->add_copy(buf + f, len), sh->oslot[a.peer]);
      }
      ch.execute_copy(m, 0);
    } else {
      if (!ch.acquire(0, m)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        push_dst(sh->add_copy(sh->islot[a.peer], len), buf + f);
      }
      ch.execute_copy(0, m);
    }
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

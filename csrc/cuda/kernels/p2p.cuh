// Point-to-point copy on the p2p channel set (separate slots and counters from collectives, so a
// send/recv may run on another stream while a collective runs).
//
//   Message of `bytes` to/from `peer`, cut into `nchunks` chunks of at most a slot; chunk j goes
//   through CTA j % blocks (a message of no bytes: one empty chunk, which carries the length).
//   Both ends derive chunk and blocks from the message length (gpu::plan_p2p), so they agree; when
//   the lengths differ, the first chunk of CTA 0 carries the mismatch to the receiver.
//   send: wait for a free slot of channel me->peer, copy the chunk in, post it with the total
//         message length beside it.
//   recv: wait for the chunk, check the sender's total length against ours (kErrSizeMismatch),
//         copy it out, free the slot.
//   A batch launch (P2PBatchArgs) runs several messages side by side, each on its own CTAs and
//   cut as it would be alone; CTA k of a message drives channel k of its pair either way.
//   Messages between one pair are matched in issue order. A send waits for the receiver once a
//   channel it uses holds kP2PSlots unconsumed chunks: a message of more than that many chunks per
//   CTA, or any send behind unreceived ones (channel 0 carries a chunk of every message). It then
//   needs the matching recv to run concurrently (the backend issues sends and receives on
//   different streams), and two opposite sends drain each other's channels without deadlock.
#pragma once

#include "cuda/kernels/args.h"
#include "cuda/kernels/channel.cuh"

namespace pycoll {
namespace kernels {

// One message as a CTA sees it: the message's plan, and which of its `blocks` CTAs this one is.
struct P2PMessage {
  char* buf;
  int64_t bytes;
  int64_t chunk;
  int64_t nchunks;
  int peer;
  bool is_send;
  int blocks;
  int block;  // 0 .. blocks-1; also the channel of the pair this CTA drives
};

static __device__ bool p2p_run(const P2PMessage& a, BlockChannels& ch, StepShared* sh) {
  const uint32_t m = 1u << a.peer;
  const int B = a.blocks;
  const int64_t K = block_chunk_count(a.nchunks, a.block, B);
  for (int64_t k = 0; k < K; ++k) {
    const int64_t f = (int64_t(a.block) + k * B) * a.chunk;
    const int64_t len = a.bytes - f < a.chunk ? a.bytes - f : a.chunk;
    if (a.is_send) {
      if (!ch.acquire(m, 0)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        push_dst(sh->add_copy(a.buf + f, len), sh->oslot[a.peer]);
      }
      ch.execute_copy(m, 0);
    } else {
      if (!ch.acquire(0, m)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        push_dst(sh->add_copy(sh->islot[a.peer], len), a.buf + f);
      }
      ch.execute_copy(0, m);
    }
  }
  return true;
}

// The message CTA blockIdx.x of a single send/recv launch serves.
static __device__ P2PMessage p2p_message(const P2PArgs& a) {
  return P2PMessage{
      static_cast<char*>(a.buf), a.bytes, a.chunk, a.nchunks, a.peer, a.is_send != 0, a.blocks, int(blockIdx.x)};
}

// The message CTA blockIdx.x of a batch launch serves (the ops' CTA ranges are consecutive).
static __device__ P2PMessage p2p_message(const P2PBatchArgs& a) {
  int i = 0;
  while (i + 1 < a.nops && int(blockIdx.x) >= a.ops[i + 1].first_block) ++i;
  const P2PBatchOp& o = a.ops[i];
  return P2PMessage{static_cast<char*>(o.buf),      o.bytes, o.chunk, o.nchunks, o.peer, o.is_send != 0, o.blocks,
                    int(blockIdx.x) - o.first_block};
}

}  // namespace kernels
}  // namespace pycoll

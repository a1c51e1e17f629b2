// Broadcast and reduce (rooted collectives), direct: the root talks to every peer over its own
// channel.
//
//   chunk k of CTA b: [c*chunk, ...) of the tensor, c = b + k*B.
//   broadcast: root: copy chunk k into channel root->p for every peer p;
//              other: wait for chunk k from the root, copy it into the tensor (in place).
//              Bytes sent by the root: (n-1) * bytes.
//   reduce:    other: copy chunk k of `in` into channel me->root;
//              root: wait for chunk k from every peer, reduce the n copies in rank order (its own
//              from `in`), store to `out`. Non-roots leave `out` untouched.
//              Bytes received by the root: (n-1) * count * elem_size.
#pragma once

#include "cuda/kernels/args.h"
#include "cuda/kernels/channel.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool broadcast_direct(const CopyArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const int root = a.root;
  const uint32_t peers = peer_mask(n, me);
  const uint32_t from_root = 1u << root;
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  char* buf = static_cast<char*>(a.out);
  for (int64_t k = 0; k < K; ++k) {
    const int64_t f = (int64_t(blockIdx.x) + k * B) * a.chunk;
    const int64_t len = a.bytes - f < a.chunk ? a.bytes - f : a.chunk;
    if (me == root) {
      if (!ch.acquire(peers, 0)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        CopyJob& j = sh->add_copy(buf + f, len);
        for (int p = 0; p < n; ++p)
          if (has(peers, p)) push_dst(j, sh->oslot[p]);
      }
      ch.execute_copy(peers, 0);
    } else {
      if (!ch.acquire(0, from_root)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        CopyJob& j = sh->add_copy(sh->islot[root], len);
        push_dst(j, buf + f);
      }
      ch.execute_copy(0, from_root);
    }
  }
  return true;
}

static __device__ bool reduce_direct(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const int root = a.root;
  const uint32_t peers = peer_mask(n, me);
  const uint32_t to_root = 1u << root;
  const int B = gridDim.x;
  const int64_t K = block_chunk_count(a.nchunks, blockIdx.x, B);
  const int64_t es = a.elem_size;
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  for (int64_t k = 0; k < K; ++k) {
    const int64_t f = (int64_t(blockIdx.x) + k * B) * a.chunk;
    const int64_t len = a.count - f < a.chunk ? a.count - f : a.chunk;
    if (me == root) {
      if (!ch.acquire(0, peers)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        ReduceJob& j = sh->set_reduce(len, a.div);
        for (int q = 0; q < n; ++q) push_src(j, q == me ? static_cast<const void*>(in + f * es) : sh->islot[q]);
        push_dst(j, out + f * es);
      }
      ch.execute(0, peers);
    } else {
      if (!ch.acquire(to_root, 0)) return false;
      if (threadIdx.x == 0) {
        sh->clear();
        CopyJob& j = sh->add_copy(in + f * es, len * es);
        push_dst(j, sh->oslot[root]);
      }
      ch.execute(to_root, 0);
    }
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

// The step verbs every kernel is written in: a CTA acquires the next slot of some outbound and
// inbound channels, thread 0 describes the data work (copy/reduce jobs), every thread runs it, and
// the CTA releases the slots. Channel terms are defined in transport/cuda_ipc/layout.h.
//
//   acquire(out_mask, in_mask)
//       For each peer p in out_mask, warp 0 lane p waits until channel me->p has a free slot
//       (head >= sent + 1 - nslots) and publishes its address in sh->oslot[p] (a peer's memory).
//       For each peer q in in_mask, warp 1 lane q waits until channel q->me holds the next message
//       (tail >= recvd + 1) and publishes sh->islot[q] (this rank's memory). Ends with a
//       __syncthreads; returns false on every thread if any wait expired or the rank is aborted.
//   thread 0 fills sh->cjob / sh->rjob from sh->oslot / sh->islot and the user's pointers.
//   execute / execute_copy(out_mask, in_mask)
//       __syncthreads; all threads run the jobs; release: __syncthreads, then lane p posts
//       tail = sent + 1 into p's memory (st.release.sys: the slot's contents are visible first),
//       lane q posts head = recvd + 1 into q's memory (our reads of the slot are done first).
//   finish()
//       stores the counters this CTA moved back into the workspace (only those: a p2p send and a
//       p2p receive may run at the same time in different kernels).
//
// Messages on one channel are consumed in the order they were sent; every algorithm below keeps
// the same step sequence on both ends, so the n ranks agree on what each message is.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/args.h"
#include "cuda/kernels/primitives.cuh"
#include "cuda/kernels/signal.cuh"
#include "transport/cuda_ipc/device_handle.h"

namespace pycoll {
namespace kernels {

using cuda_ipc::ChannelSetLayout;

constexpr int kThreads = 512;  // threads per CTA of every kernel

// Calls reduce_run<D, Op> for a runtime (dtype, op): the algorithm bodies are compiled once and
// only the data loop exists per (dtype, op). One switch per step; invalid pairs do nothing (the
// host never launches them).
static __device__ __noinline__ void reduce_dispatch(DType dtype, ReduceOp op, const ReduceJob* job) {
#define PYCOLL_ARITH_CASES(D)                                \
  switch (op) {                                              \
    case ReduceOp::Sum: reduce_run<D, OpSum>(job); return;   \
    case ReduceOp::Prod: reduce_run<D, OpProd>(job); return; \
    case ReduceOp::Min: reduce_run<D, OpMin>(job); return;   \
    case ReduceOp::Max: reduce_run<D, OpMax>(job); return;   \
    default: break;                                          \
  }
#define PYCOLL_BITWISE_CASES(D)                            \
  switch (op) {                                            \
    case ReduceOp::And: reduce_run<D, OpAnd>(job); return; \
    case ReduceOp::Or: reduce_run<D, OpOr>(job); return;   \
    case ReduceOp::Xor: reduce_run<D, OpXor>(job); return; \
    default: break;                                        \
  }
  switch (dtype) {
    case DType::Float32: PYCOLL_ARITH_CASES(DType::Float32) return;
    case DType::Float64: PYCOLL_ARITH_CASES(DType::Float64) return;
    case DType::Float16: PYCOLL_ARITH_CASES(DType::Float16) return;
    case DType::BFloat16: PYCOLL_ARITH_CASES(DType::BFloat16) return;
    case DType::Int8: PYCOLL_ARITH_CASES(DType::Int8) return;
    case DType::UInt8: PYCOLL_ARITH_CASES(DType::UInt8) PYCOLL_BITWISE_CASES(DType::UInt8) return;
    case DType::Int32: PYCOLL_ARITH_CASES(DType::Int32) PYCOLL_BITWISE_CASES(DType::Int32) return;
    case DType::Int64: PYCOLL_ARITH_CASES(DType::Int64) PYCOLL_BITWISE_CASES(DType::Int64) return;
    default: return;
  }
#undef PYCOLL_ARITH_CASES
#undef PYCOLL_BITWISE_CASES
}

// Per-CTA shared state.
struct StepShared {
  const DeviceHandle* h;  // points into the kernel arguments' shared-memory copy
  DType rdtype;           // reduce jobs' element type and operation (reduce kernel only)
  ReduceOp rop;
  char* oslot[kMaxRanks];        // slot to write, per outbound peer (in the peer's workspace)
  const char* islot[kMaxRanks];  // slot to read, per inbound peer (in this rank's workspace)
  int32_t njobs;
  int32_t has_reduce;
  CopyJob cjob[2 * kMaxRanks];  // a fused step may receive from and send to every peer
  ReduceJob rjob;

  // Thread 0 only: start describing a step.
  __device__ __forceinline__ void clear() {
    njobs = 0;
    has_reduce = 0;
  }
  __device__ __forceinline__ CopyJob& add_copy(const void* src, int64_t bytes) {
    CopyJob& j = cjob[njobs++];
    j.src = static_cast<const char*>(src);
    j.nd = 0;
    j.bytes = bytes;
    return j;
  }
  __device__ __forceinline__ ReduceJob& set_reduce(int64_t count, int div) {
    has_reduce = 1;
    rjob.ns = 0;
    rjob.nd = 0;
    rjob.div = div;
    rjob.count = count;
    return rjob;
  }
};

__device__ __forceinline__ void push_dst(CopyJob& j, void* p) { j.dst[j.nd++] = static_cast<char*>(p); }
__device__ __forceinline__ void push_src(ReduceJob& j, const void* p) { j.src[j.ns++] = p; }
__device__ __forceinline__ void push_dst(ReduceJob& j, void* p) { j.dst[j.nd++] = p; }

// Every rank but `me`.
__device__ __forceinline__ uint32_t peer_mask(int n, int me) { return ((1u << n) - 1u) & ~(1u << me); }
__device__ __forceinline__ bool has(uint32_t mask, int q) { return (mask >> q) & 1u; }

// Number of chunks CTA b of B handles when chunk c goes to CTA c % B.
__device__ __forceinline__ int64_t block_chunk_count(int64_t nchunks, int b, int B) {
  return nchunks > b ? (nchunks - b + B - 1) / B : 0;
}

// The CTA copies the kernel arguments into shared memory (so that noinline code can take their
// address without a per-thread local copy), one 8-byte word per thread: a single thread copying
// the ~600-900 bytes one word after another cost a visible part of a small collective's latency.
// `args` must be a __grid_constant__ kernel parameter (its address is then valid); everyone waits.
template <class Args>
__device__ __forceinline__ void load_args(StepShared* sh, Args* smem_args, const Args& args, DType dtype, ReduceOp op) {
  static_assert(sizeof(Args) % sizeof(uint64_t) == 0 && alignof(Args) >= alignof(uint64_t),
                "kernel arguments are copied in 8-byte words");
  const uint64_t* src = reinterpret_cast<const uint64_t*>(&args);
  uint64_t* dst = reinterpret_cast<uint64_t*>(smem_args);
  for (int i = int(threadIdx.x); i < int(sizeof(Args) / sizeof(uint64_t)); i += int(blockDim.x)) dst[i] = src[i];
  if (threadIdx.x == 0) {
    sh->h = &smem_args->h;
    sh->rdtype = dtype;
    sh->rop = op;
  }
  __syncthreads();
}

class BlockChannels {
 public:
  // Which directions of its channel a CTA serves: both (every kernel but the split one-shot) or
  // one (the split one-shot gives the outbound and the inbound side of a channel to two CTAs).
  static constexpr uint32_t kOutbound = 1u;
  static constexpr uint32_t kInbound = 2u;

  // `check`: the word every message carries and the receiver compares (check_word.h). `chan`: the
  // channel index this CTA drives (-1: its blockIdx.x); `roles`: kOutbound and/or kInbound.
  __device__ BlockChannels(StepShared* sh, const ChannelSetLayout* set, int op, uint64_t check, int chan = -1,
                           uint32_t roles = kOutbound | kInbound)
      : sh_(sh), set_(set), op_(op), check_(check), chan_(chan < 0 ? int(blockIdx.x) : chan) {
    const DeviceHandle* h = sh->h;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    peer_ = lane;
    role_ = 0;
    if (lane < h->nranks && lane != h->rank && chan_ < set->nblocks) {
      if (warp == 0 && (roles & kOutbound)) role_ = 1;
      if (warp == 1 && (roles & kInbound)) role_ = 2;
    }
    dirty_ = false;
    cnt_ = 0;
    if (role_ == 1) {
      cnt_ = *reinterpret_cast<const uint64_t*>(h->base[h->rank] + set->sent_offset(chan_, peer_));
    } else if (role_ == 2) {
      cnt_ = *reinterpret_cast<const uint64_t*>(h->base[h->rank] + set->recvd_offset(chan_, peer_));
    }
  }

  // `ok`: the caller's own wait of this step (false fails the step on every thread).
  __device__ bool acquire(uint32_t out_mask, uint32_t in_mask, bool ok = true) {
    const DeviceHandle* h = sh_->h;
    const int me = h->rank;
    const int b = chan_;
    const ChannelSetLayout& L = *set_;
    if (role_ == 1 && has(out_mask, peer_)) {
      ok = outbound_credit(0) && ok;
      sh_->oslot[peer_] = outbound_slot(0);
    } else if (role_ == 2 && has(in_mask, peer_)) {
      const uint64_t* tail = reinterpret_cast<const uint64_t*>(h->base[me] + L.tail_offset(peer_, b));
      ok = wait_ge(h, tail, cnt_ + 1, WaitSite{op_, b, peer_, cuda_ipc::kWaitData}, check_) && ok;
      const int s = int(cnt_ % L.nslots);
      if (ok) {
        const uint64_t got = *reinterpret_cast<const volatile uint64_t*>(h->base[me] + L.check_offset(peer_, b, s));
        if (got != check_) {
          raise_error(h, op_ == 0 ? cuda_ipc::kErrSizeMismatch : cuda_ipc::kErrOpMismatch,
                      WaitSite{op_, b, peer_, cuda_ipc::kWaitData}, check_, got, 0);
          ok = false;
        }
      }
      sh_->islot[peer_] = h->base[me] + L.slot_offset(h->nranks, peer_, me, b, s);
    }
    return __syncthreads_and(ok ? 1 : 0) != 0;
  }

  __device__ void release(uint32_t out_mask, uint32_t in_mask) {
    __syncthreads();
    const DeviceHandle* h = sh_->h;
    const int me = h->rank;
    const int b = chan_;
    const ChannelSetLayout& L = *set_;
    if (role_ == 1 && has(out_mask, peer_)) {
      outbound_publish(0);
      outbound_advance(1);
    } else if (role_ == 2 && has(in_mask, peer_)) {
      st_release_sys(reinterpret_cast<uint64_t*>(h->base[peer_] + L.head_offset(me, b)), cnt_ + 1);
      ++cnt_;
      dirty_ = true;
    }
  }

  // Per-lane outbound verbs, for a CTA whose warp 0 posts while its other warps move data (the
  // split one-shot pusher, one_shot.cuh); acquire and release use them for one message. Lane p of
  // warp 0 manages peer p; on any other thread they do nothing. Message k is the k-th after the
  // channel's next unsent one; outbound_advance(K) then counts K messages as sent.
  __device__ bool outbound_credit(int64_t k) {  // waits until message k has a free slot at the peer
    if (role_ != 1) return true;
    const uint64_t need = cnt_ + uint64_t(k) + 1;
    if (need <= uint64_t(set_->nslots)) return true;
    const DeviceHandle* h = sh_->h;
    const uint64_t* head = reinterpret_cast<const uint64_t*>(h->base[h->rank] + set_->head_offset(peer_, chan_));
    return wait_ge(h, head, need - set_->nslots, WaitSite{op_, chan_, peer_, cuda_ipc::kWaitCredit}, check_);
  }
  __device__ char* outbound_slot(int64_t k) const {  // where message k goes, in the peer's workspace
    if (role_ != 1) return nullptr;
    const DeviceHandle* h = sh_->h;
    return h->base[peer_] +
           set_->slot_offset(h->nranks, h->rank, peer_, chan_, int((cnt_ + uint64_t(k)) % set_->nslots));
  }
  // Message k is stored: its check word, then the tail (st.release.sys: after the data).
  __device__ void outbound_publish(int64_t k) {
    if (role_ != 1) return;
    const DeviceHandle* h = sh_->h;
    const int me = h->rank;
    const int slot = int((cnt_ + uint64_t(k)) % set_->nslots);
    *reinterpret_cast<volatile uint64_t*>(h->base[peer_] + set_->check_offset(me, chan_, slot)) = check_;
    st_release_sys(reinterpret_cast<uint64_t*>(h->base[peer_] + set_->tail_offset(me, chan_)), cnt_ + uint64_t(k) + 1);
  }
  // A word that travels with message k in a side array of the peer's workspace (`offset(src, chan,
  // slot)`), e.g. which chunk the message holds; store it before outbound_publish(k).
  template <class Offset>
  __device__ void outbound_tag(int64_t k, Offset offset, uint64_t word) {
    if (role_ != 1) return;
    const DeviceHandle* h = sh_->h;
    const int slot = int((cnt_ + uint64_t(k)) % set_->nslots);
    *reinterpret_cast<volatile uint64_t*>(h->base[peer_] + offset(h->rank, chan_, slot)) = word;
  }
  // The inbound lane of `peer`, after acquire() and before release(): the word the sender stored
  // with the message just acquired (ordered after the acquire's load of the tail).
  __device__ bool is_inbound_lane(int peer) const { return role_ == 2 && peer_ == peer; }
  template <class Offset>
  __device__ uint64_t inbound_tag(Offset offset) const {
    const DeviceHandle* h = sh_->h;
    const int slot = int(cnt_ % set_->nslots);
    return *reinterpret_cast<const volatile uint64_t*>(h->base[h->rank] + offset(peer_, chan_, slot));
  }
  __device__ void outbound_advance(int64_t count) {
    if (role_ != 1 || count <= 0) return;
    cnt_ += uint64_t(count);
    dirty_ = true;
  }

  // Runs the jobs thread 0 described, then releases.
  __device__ void execute(uint32_t out_mask, uint32_t in_mask) {
    run_jobs();
    release(out_mask, in_mask);
  }
  // The first half of execute: every thread's loads and stores of the step are issued when it
  // returns (not yet visible to the peers: release() does that).
  __device__ void run_jobs() {
    __syncthreads();
    if (sh_->has_reduce) reduce_dispatch(sh_->rdtype, sh_->rop, &sh_->rjob);
    if (sh_->njobs > 0) copy_run(sh_->cjob, sh_->njobs);
  }
  // Same, for kernels that never reduce (they then do not link the reduce instantiations).
  __device__ void execute_copy(uint32_t out_mask, uint32_t in_mask) {
    __syncthreads();
    if (sh_->njobs > 0) copy_run(sh_->cjob, sh_->njobs);
    release(out_mask, in_mask);
  }

  __device__ void finish() {
    if (!dirty_) return;
    const DeviceHandle* h = sh_->h;
    char* mine = h->base[h->rank];
    if (role_ == 1) {
      *reinterpret_cast<uint64_t*>(mine + set_->sent_offset(chan_, peer_)) = cnt_;
    } else if (role_ == 2) {
      *reinterpret_cast<uint64_t*>(mine + set_->recvd_offset(chan_, peer_)) = cnt_;
    }
  }

 private:
  StepShared* sh_;
  const ChannelSetLayout* set_;
  int op_;
  uint64_t check_;
  int chan_;
  int peer_;
  int role_;  // 0 none, 1 outbound manager of peer_, 2 inbound manager of peer_
  bool dirty_;
  uint64_t cnt_;  // role 1: messages sent to peer_; role 2: messages consumed from peer_
};

}  // namespace kernels
}  // namespace pycoll

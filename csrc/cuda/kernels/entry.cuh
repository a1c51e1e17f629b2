// Kernel entry points: one reduce kernel, one copy kernel, the p2p kernels (one message, a batch).
// Each copies its arguments to shared memory, waits for the kernel before it on the stream (it may
// have been scheduled early, grid_dependency.cuh), builds the CTA's channel endpoints, runs the
// body the mode names, and stores the channel counters back when the body completed (after an
// error the rank is aborted for good, so the counters no longer matter).
//
// The algorithm bodies do not depend on the dtype or the op (they move bytes and describe reduce
// jobs), so they are compiled once; only reduce_run<D, Op> exists per (dtype, op), reached through
// reduce_dispatch (channel.cuh) once per step. This keeps compile time and code size small.
#pragma once

#include "cuda/kernels/all_gather.cuh"
#include "cuda/kernels/all_to_all.cuh"
#include "cuda/kernels/args.h"
#include "cuda/kernels/barrier.cuh"
#include "cuda/kernels/broadcast_reduce.cuh"
#include "cuda/kernels/channel.cuh"
#include "cuda/kernels/grid_dependency.cuh"
#include "cuda/kernels/one_shot.cuh"
#include "cuda/kernels/one_shot_claimed.cuh"
#include "cuda/kernels/p2p.cuh"
#include "cuda/kernels/reduce_scatter.cuh"
#include "cuda/kernels/ring.cuh"
#include "cuda/kernels/trace.cuh"
#include "cuda/kernels/tree.cuh"
#include "cuda/kernels/two_shot.cuh"
#include "transport/cuda_ipc/check_word.h"

namespace pycoll {
namespace kernels {

static __global__ void __launch_bounds__(kThreads, 1) reduce_kernel(const __grid_constant__ ReduceArgs args) {
  __shared__ ReduceArgs sa;
  __shared__ StepShared sh_storage;
  StepShared* sh = &sh_storage;
  load_args(sh, &sa, args, args.dtype, args.rop);
  wait_for_previous_grid();
  let_next_grid_launch();
  const ReduceArgs& a = sa;
  int chan = -1;  // every mode but the split one-shot: channel = blockIdx.x, both directions
  uint32_t roles = BlockChannels::kOutbound | BlockChannels::kInbound;
  if (a.mode == ReduceMode::AllReduceOneShotSplit) {
    const int C = int(gridDim.x) / 2;
    chan = int(blockIdx.x) % C;
    roles = int(blockIdx.x) < C ? BlockChannels::kOutbound : BlockChannels::kInbound;
  }
  BlockChannels ch(sh, &a.h.layout.coll, a.op, a.check, chan, roles);
  const bool stamp = (a.flags & kArgTrace) != 0 && a.mode != ReduceMode::AllReduceOneShotSplit && threadIdx.x == 0;
  if (stamp) trace_now(sh->h, true, int(blockIdx.x), 0);  // the split kernels stamp their own rows
  bool ok = false;
  switch (a.mode) {
    case ReduceMode::AllReduceOneShot: ok = one_shot_all_reduce(a, ch, sh); break;
    case ReduceMode::AllReduceOneShotSplit:
      ok = (a.flags & kArgClaimed) ? one_shot_claimed_all_reduce(a, ch, sh) : one_shot_split_all_reduce(a, ch, sh);
      break;
    case ReduceMode::AllReduceTwoShot: ok = two_shot_all_reduce(a, ch, sh); break;
    case ReduceMode::AllReduceRing: ok = ring_all_reduce(a, ch, sh); break;
    case ReduceMode::AllReduceTree: ok = tree_all_reduce(a, ch, sh); break;
    case ReduceMode::ReduceScatterDirect: ok = reduce_scatter_direct(a, ch, sh); break;
    case ReduceMode::ReduceScatterRing: ok = reduce_scatter_ring(a, ch, sh); break;
    case ReduceMode::ReduceDirect: ok = reduce_direct(a, ch, sh); break;
  }
  if (ok) ch.finish();
  if (stamp) trace_now(sh->h, true, int(blockIdx.x), 1);
}

static __global__ void __launch_bounds__(kThreads, 1) copy_kernel(const __grid_constant__ CopyArgs a) {
  __shared__ CopyArgs sa;
  __shared__ StepShared sh;
  load_args(&sh, &sa, a, DType::UInt8, ReduceOp::Or);
  wait_for_previous_grid();
  let_next_grid_launch();
  int chan = -1;  // every mode but all_to_all: channel = blockIdx.x, both directions
  uint32_t roles = BlockChannels::kOutbound | BlockChannels::kInbound;
  uint64_t check = sa.check;
  if (sa.mode == CopyMode::AllToAll) {  // one side of one pair per CTA (all_to_all.cuh)
    const AllToAllRole r = all_to_all_role(sa.h.nranks, sa.h.rank, int(gridDim.x), int(blockIdx.x));
    chan = r.chan;
    roles = r.sender ? BlockChannels::kOutbound : BlockChannels::kInbound;
    // Both ends of a pair must agree on its size: a receiver expecting fewer bytes would leave
    // the sender's extra chunks in the channel for the next all_to_all to read as its own.
    if (r.peer >= 0)
      check = cuda_ipc::with_pair_bytes(sa.check, r.sender ? sa.send_bytes[r.peer] : sa.recv_bytes[r.peer]);
  }
  BlockChannels ch(&sh, &sa.h.layout.coll, sa.op, check, chan, roles);
  bool ok = false;
  switch (sa.mode) {
    case CopyMode::AllGatherDirect: ok = all_gather_direct(sa, ch, &sh); break;
    case CopyMode::AllGatherRing: ok = all_gather_ring(sa, ch, &sh); break;
    case CopyMode::Broadcast: ok = broadcast_direct(sa, ch, &sh); break;
    case CopyMode::AllToAll: ok = all_to_all(sa, ch, &sh); break;
    case CopyMode::Barrier: ok = barrier_all(ch, &sh); break;
  }
  if (ok) ch.finish();
}

// A launch of one send or receive may be its receive's gate (kP2PGate); a batch never is. Only
// one send or receive stamps its timeline (kP2PTrace).
static __device__ __forceinline__ bool p2p_gate_only(const P2PArgs& a) { return (a.flags & kP2PGate) != 0; }
static __device__ __forceinline__ bool p2p_gate_only(const P2PBatchArgs&) { return false; }
static __device__ __forceinline__ bool p2p_traced(const P2PArgs& a) { return (a.flags & kP2PTrace) != 0; }
static __device__ __forceinline__ bool p2p_traced(const P2PBatchArgs&) { return false; }

// One CTA of a p2p launch (`Args`: one message, P2PArgs, or a coalesced batch, P2PBatchArgs):
// the message p2p_message says it serves, on its channel of the pair.
template <class Args>
static __device__ __forceinline__ void p2p_cta(const Args& a) {
  __shared__ Args sa;
  __shared__ StepShared sh;
  load_args(&sh, &sa, a, DType::UInt8, ReduceOp::Or);
  wait_for_previous_grid();
  let_next_grid_launch();
  const P2PMessage m = p2p_message(sa);
  BlockChannels ch(&sh, &sa.h.layout.p2p, /*op=*/0, uint64_t(m.bytes), m.block,
                   m.is_send ? BlockChannels::kOutbound : BlockChannels::kInbound);
  if (p2p_gate_only(sa)) {
    // Wait for (and check the length of) the first chunk; the receive kernel consumes it.
    (void)ch.acquire(0, 1u << m.peer);
    return;
  }
  const bool stamp = p2p_traced(sa) && threadIdx.x == 0;
  if (stamp) trace_now(&sa.h, true, int(blockIdx.x), 0);
  if (p2p_run(m, ch, &sh)) ch.finish();
  if (stamp) trace_now(&sa.h, true, int(blockIdx.x), 1);
}

static __global__ void __launch_bounds__(kThreads, 1) p2p_kernel(const __grid_constant__ P2PArgs a) { p2p_cta(a); }

// Sends and receives of one coalesced batch in one launch (p2p.cuh).
static __global__ void __launch_bounds__(kThreads, 1) p2p_batch_kernel(const __grid_constant__ P2PBatchArgs a) {
  p2p_cta(a);
}

}  // namespace kernels
}  // namespace pycoll

// Kernel entry points: one reduce kernel per (dtype, op), one copy kernel, one p2p kernel. Each
// copies the device handle to shared memory, builds the CTA's channel endpoints, runs the body the
// mode names, and stores the channel counters back when the body completed (after an error the
// rank is aborted for good, so the counters no longer matter).
#pragma once

#include "kernels/all_gather.cuh"
#include "kernels/all_to_all.cuh"
#include "kernels/args.h"
#include "kernels/barrier.cuh"
#include "kernels/broadcast_reduce.cuh"
#include "kernels/channel.cuh"
#include "kernels/one_shot.cuh"
#include "kernels/p2p.cuh"
#include "kernels/reduce_scatter.cuh"
#include "kernels/ring.cuh"
#include "kernels/tree.cuh"
#include "kernels/two_shot.cuh"

namespace pycoll {
namespace kernels {

template <DType D, class Op>
__global__ void __launch_bounds__(kThreads, 1) reduce_kernel(const ReduceArgs a) {
  __shared__ StepShared sh;
  load_handle(&sh, a.h);
  BlockChannels ch(&sh, &sh.h.layout.coll, a.op, 0);
  bool ok = false;
  switch (a.mode) {
    case ReduceMode::AllReduceOneShot: ok = one_shot_all_reduce<D, Op>(a, ch, &sh); break;
    case ReduceMode::AllReduceTwoShot: ok = two_shot_all_reduce<D, Op>(a, ch, &sh); break;
    case ReduceMode::AllReduceRing: ok = ring_all_reduce<D, Op>(a, ch, &sh); break;
    case ReduceMode::AllReduceTree: ok = tree_all_reduce<D, Op>(a, ch, &sh); break;
    case ReduceMode::ReduceScatterDirect: ok = reduce_scatter_direct<D, Op>(a, ch, &sh); break;
    case ReduceMode::ReduceScatterRing: ok = reduce_scatter_ring<D, Op>(a, ch, &sh); break;
    case ReduceMode::ReduceDirect: ok = reduce_direct<D, Op>(a, ch, &sh); break;
  }
  if (ok) ch.finish();
}

__global__ void __launch_bounds__(kThreads, 1) copy_kernel(const CopyArgs a) {
  __shared__ StepShared sh;
  load_handle(&sh, a.h);
  BlockChannels ch(&sh, &sh.h.layout.coll, a.op, 0);
  bool ok = false;
  switch (a.mode) {
    case CopyMode::AllGatherDirect: ok = all_gather_direct(a, ch, &sh); break;
    case CopyMode::AllGatherRing: ok = all_gather_ring(a, ch, &sh); break;
    case CopyMode::Broadcast: ok = broadcast_direct(a, ch, &sh); break;
    case CopyMode::AllToAll: ok = all_to_all(a, ch, &sh); break;
    case CopyMode::Barrier: ok = barrier_all(ch, &sh); break;
  }
  if (ok) ch.finish();
}

__global__ void __launch_bounds__(kThreads, 1) p2p_kernel(const P2PArgs a) {
  __shared__ StepShared sh;
  load_handle(&sh, a.h);
  BlockChannels ch(&sh, &sh.h.layout.p2p, /*op=*/0, uint64_t(a.bytes));
  if (p2p_run(a, ch, &sh)) ch.finish();
}

}  // namespace kernels
}  // namespace pycoll

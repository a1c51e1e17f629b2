// Two-shot all-reduce: a direct reduce-scatter followed by a direct all-gather. With
// gather = false the same code is the direct reduce-scatter (reduce_scatter.cuh).
//
//   segment q: clamp(count - q*seg, 0, seg) elements at in + q*seg; rank q owns segment q.
//   slice (q, k): the part of segment q that chunk k covers: offset first(k) = (b + k*B) * chunk
//                 inside the segment, length clamp(seglen(q) - first(k), 0, chunk). Slices may be
//                 empty near the end; an empty message is still sent so both ends stay in step.
//   scatter(k): for every peer p, push my slice (p, k) to p.
//   reduce(k):  wait for slice (me, k) from every peer, reduce the n slices in rank order (mine
//               from `in`), store to out + me*out_stride and, with gather, push the result to
//               every peer. Only the owner computes a segment, so every rank ends with the same bits.
//   gather(k):  wait for every peer's reduced slice (q, k), copy it to out + q*out_stride.
//   Schedule with gather:    scatter(0); for k: reduce(k); then gather(k) and scatter(k+1) in one
//                            step (channel me->p carries scatter(0), result(0), scatter(1), ...,
//                            the order p consumes them).
//   Schedule without gather: scatter(0); for k: reduce(k) and scatter(k+1) in one step.
//   A fused step waits for a message the peers sent in an earlier step and for a slot freed in an
//   earlier step, so no cycle of waits can form (needs nslots >= 2).
//   Two flag hops; bytes sent per rank: 2 * (n-1)/n * count * elem_size (half without gather).
//
// Waves (kArgWaves, all_reduce): CTAs [H, 2H) (H = gridDim.x / 2) start their first scatter only
// once their partner b - H has issued its own, so that while the first wave waits for its flags,
// fences and loads between phases, the second wave's data keeps the link busy, and the first
// wave's final copy overlaps the second wave's last phase. Without it all CTAs run their phases in
// lockstep and the link idles at every phase change (docs/decisions/0009-two-shot-waves.md).
// Only a start delay: no data depends on it. The partner counts its posts in SplitLayout::pushed
// and the follower its waits in ::reduced (both once per call, so they are equal at every kernel
// start, the split one-shot's invariant too, whose channels share the words).
#pragma once

#include "cuda/kernels/args.h"
#include "cuda/kernels/block_chunks.cuh"
#include "cuda/kernels/channel.cuh"
#include "cuda/kernels/trace.cuh"

namespace pycoll {
namespace kernels {

// The trace event of the wave hand-over (kArgWaves), after the sequential step stamps.
constexpr int kTraceWaveEvent = cuda_ipc::kTraceEvents - 2;

static __device__ bool direct_reduce_scatter(const ReduceArgs& a, BlockChannels& ch, StepShared* sh, bool gather) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const uint32_t peers = peer_mask(n, me);
  const ReduceChunks c(a);
  const int64_t K = c.count();

  // Jobs of the current step (thread 0 only).
  auto add_scatter = [&](int64_t k) {
    for (int p = 0; p < n; ++p)
      if (has(peers, p)) push_dst(sh->add_copy(c.src(p, k), c.slice(p, k) * c.es), sh->oslot[p]);
  };
  auto add_reduce = [&](int64_t k, uint32_t result_to) {
    ReduceJob& j = sh->set_reduce(c.slice(me, k), a.div);
    for (int q = 0; q < n; ++q) push_src(j, q == me ? static_cast<const void*>(c.src(me, k)) : sh->islot[q]);
    push_dst(j, c.dst(me, k));
    for (int p = 0; p < n; ++p)
      if (has(result_to, p)) push_dst(j, sh->oslot[p]);
  };
  // PYCOLL_CUDA_TRACE: thread 0 stamps events 2, 3, 4, ... after each acquire and each execute
  // (cuda/kernels/trace.cuh); event kTraceEvents-1 holds how many it stamped; with waves, event
  // kTraceWaveEvent is when a leader posted its wave / a follower saw its leader's post.
  int ev = 2;
  auto stamp = [&]() {
    if ((a.flags & kArgTrace) && threadIdx.x == 0 && ev < kTraceWaveEvent) {
      trace_now(sh->h, true, int(blockIdx.x), ev);
      trace_mark(sh->h, true, int(blockIdx.x), cuda_ipc::kTraceEvents - 1, uint64_t(ev - 1));
    }
    ++ev;
  };
  auto add_gather = [&](int64_t k) {
    for (int q = 0; q < n; ++q)
      if (has(peers, q)) push_dst(sh->add_copy(sh->islot[q], c.slice(q, k) * c.es), c.dst(q, k));
  };

  const int H = int(gridDim.x) / 2;
  const bool waves = gather && (a.flags & kArgWaves) != 0 && H >= 1;
  const bool leader = waves && int(blockIdx.x) < H;
  const bool follower = waves && int(blockIdx.x) >= H && int(blockIdx.x) < 2 * H;
  const DeviceHandle* h = sh->h;
  uint64_t* wave_word = nullptr;  // leader: its post count; follower: its wait count
  uint64_t wave_base = 0;
  if (waves && (leader || follower) && threadIdx.x == 0) {
    const int pair = leader ? int(blockIdx.x) : int(blockIdx.x) - H;
    char* mine = h->base[h->rank];
    wave_word = reinterpret_cast<uint64_t*>(
        mine + (leader ? h->layout.split.pushed_offset(pair) : h->layout.split.reduced_offset(pair)));
    wave_base = *reinterpret_cast<volatile uint64_t*>(wave_word);  // only this CTA writes it
  }
  const bool traced = (a.flags & kArgTrace) != 0;
  auto post_wave = [&]() {
    if (leader && threadIdx.x == 0) {
      st_release_gpu(wave_word, wave_base + 1);
      trace_now(h, traced, int(blockIdx.x), kTraceWaveEvent);
    }
  };
  bool ok = true;
  if (follower && threadIdx.x == 0) {
    const uint64_t* posted =
        reinterpret_cast<const uint64_t*>(h->base[h->rank] + h->layout.split.pushed_offset(int(blockIdx.x) - H));
    ok = wait_local_ge(h, posted, wave_base + 1, WaitSite{a.op, int(blockIdx.x), h->rank, cuda_ipc::kWaitLocal});
    trace_now(h, traced, int(blockIdx.x), kTraceWaveEvent);
  }
  if (K > 0) {  // scatter(0)
    if (!ch.acquire(peers, 0, ok)) return false;
    stamp();
    if (threadIdx.x == 0) {
      sh->clear();
      add_scatter(0);
    }
    ch.run_jobs();
    __syncthreads();  // every thread's stores of scatter(0) are issued
    post_wave();
    ch.release(peers, 0);
    stamp();
  } else {
    post_wave();
    if (!__syncthreads_and(ok ? 1 : 0)) return false;
  }
  for (int64_t k = 0; k < K; ++k) {
    const bool more = k + 1 < K;
    if (gather) {
      // reduce(k): in from every peer, result out to every peer.
      if (!ch.acquire(peers, peers)) return false;
      stamp();
      if (threadIdx.x == 0) {
        sh->clear();
        add_reduce(k, peers);
      }
      ch.execute(peers, peers);
      stamp();
      // gather(k) + scatter(k+1).
      const uint32_t out_mask = more ? peers : 0u;
      if (!ch.acquire(out_mask, peers)) return false;
      stamp();
      if (threadIdx.x == 0) {
        sh->clear();
        add_gather(k);
        if (more) add_scatter(k + 1);
      }
      ch.execute(out_mask, peers);
      stamp();
    } else {
      // reduce(k) + scatter(k+1).
      if (!run_step</*kCopyOnly=*/false>(ch, sh, more ? peers : 0u, peers, [&] {
            add_reduce(k, 0u);
            if (more) add_scatter(k + 1);
          }))
        return false;
    }
  }
  if (follower && threadIdx.x == 0) *wave_word = wave_base + 1;
  return true;
}

static __device__ bool two_shot_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  return direct_reduce_scatter(a, ch, sh, /*gather=*/true);
}

}  // namespace kernels
}  // namespace pycoll

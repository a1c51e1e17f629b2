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
//
// Split one-shot: the same messages, but the two halves of a step run on different CTAs so that
// neither waits for the other. With C channels the grid has 2C CTAs: CTA b < C is the pusher of
// channel b (outbound only: push(k) for every chunk k of the channel, limited by slot credits
// alone) and CTA C + b its reducer (inbound only: wait for chunk k from every peer, reduce, store).
// In the fused kernel a step's reduce and push run one after the other and every step waits a flag
// hop, so the link idles while the CTAs reduce or wait; split, the pushers keep the link busy and
// the reduction overlaps it.
//   Chunks: channel b owns the contiguous range [b*seg, (b+1)*seg) of the message (a.seg elements,
//   the last channel's range may be short or empty), cut into chunks of a.chunk elements, except
//   that an odd channel's first chunk is half as long (channels that all cut at the same offsets
//   would publish at the same moments), and with the taper a last chunk longer than half a chunk
//   is cut in two (less reduction left after the last data landed). Neither changed the measured
//   time (docs/decisions/0004-split-one-shot.md); both are cheap and kept as the documented plan.
//   The pusher's poster warp publishes chunk k while its data warps store chunk k+1 (split_push),
//   so the fence a publication needs overlaps data movement.
//   Two ranks only (the engine's choice); written for n, as the fused kernel.
//   In-place calls (out == in) need one extra order: the reducer may overwrite chunk k of `in` only
//   after this rank's pusher has read it. The pusher counts the chunks it has pushed in the
//   workspace (SplitLayout: pushed, st.release.gpu after each push), the reducer counts those it
//   reduced (reduced, stored at the end); both CTAs of a channel handle the same chunks in every
//   call, so the counts are equal at kernel start and the reducer waits for pushed >= its start
//   count + k + 1 before it stores chunk k.
//   Every CTA of the grid must be resident at once (reducers wait for pushers): 2C <= SMs.
#pragma once

#include "cuda/kernels/args.h"
#include "cuda/kernels/block_chunks.cuh"
#include "cuda/kernels/channel.cuh"
#include "cuda/kernels/trace.cuh"

namespace pycoll {
namespace kernels {

static __device__ bool one_shot_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  const int n = sh->h->nranks;
  const int me = sh->h->rank;
  const uint32_t peers = peer_mask(n, me);
  const ReduceChunks c(a);
  const int64_t K = c.count();

  // Copies of chunk k to every peer, as a job of the current step.
  auto add_push = [&](int64_t k) {
    CopyJob& j = sh->add_copy(c.in + c.first(k) * c.es, c.length(k) * c.es);
    for (int p = 0; p < n; ++p)
      if (has(peers, p)) push_dst(j, sh->oslot[p]);
  };

  if (K > 0 && !run_step</*kCopyOnly=*/false>(ch, sh, peers, 0u, [&] { add_push(0); })) return false;  // push(0)
  for (int64_t k = 0; k < K; ++k) {  // reduce(k) + push(k+1)
    const uint32_t out_mask = k + 1 < K ? peers : 0u;
    if (!run_step</*kCopyOnly=*/false>(ch, sh, out_mask, peers, [&] {
          ReduceJob& j = sh->set_reduce(c.length(k), a.div);
          for (int q = 0; q < n; ++q)
            push_src(j, q == me ? static_cast<const void*>(c.in + c.first(k) * c.es) : sh->islot[q]);
          push_dst(j, c.out + c.first(k) * c.es);
          if (k + 1 < K) add_push(k + 1);
        }))
      return false;
  }
  return true;
}

// Chunk k of a split one-shot channel: its first element inside the channel's range and its
// length (elements). Positions: 0, head, head + chunk, head + 2*chunk, ... (head = chunk/2 on odd
// channels, else chunk), and with `taper` a last chunk longer than chunk/2 is cut in two at
// chunk/2: what is left to reduce after the last data has landed is then at most half a chunk.
struct SplitChunks {
  int64_t len;    // elements of the channel's range
  int64_t chunk;  // elements of a full chunk (even, so that chunk/2 keeps the 16-byte packing)
  bool half;
  bool taper;

  __device__ __forceinline__ int64_t head() const { return half ? chunk / 2 : chunk; }
  __device__ __forceinline__ int64_t pos(int64_t k) const { return k == 0 ? 0 : head() + (k - 1) * chunk; }
  // Chunks before the taper cut.
  __device__ __forceinline__ int64_t base_count() const {
    if (len <= 0) return 0;
    return len <= head() ? 1 : 1 + (len - head() + chunk - 1) / chunk;
  }
  __device__ __forceinline__ bool cut_last() const {
    const int64_t k0 = base_count();
    return taper && k0 > 0 && len - pos(k0 - 1) > chunk / 2;
  }
  __device__ __forceinline__ int64_t count() const { return base_count() + (cut_last() ? 1 : 0); }
  __device__ __forceinline__ int64_t first(int64_t k) const {
    const int64_t k0 = base_count();
    return k < k0 ? pos(k) : pos(k0 - 1) + chunk / 2;  // k == k0 only with cut_last()
  }
  __device__ __forceinline__ int64_t length(int64_t k) const {
    const int64_t k0 = base_count();
    int64_t next;
    if (k + 1 < k0) {
      next = pos(k + 1);
    } else if (k + 1 == k0) {
      next = cut_last() ? pos(k0 - 1) + chunk / 2 : len;
    } else {
      next = len;
    }
    return (next < len ? next : len) - first(k);
  }
};

// Named CTA barriers of the split pusher (0 is __syncthreads). Both count every thread of the CTA.
constexpr int kBarReady = 1;  // the poster warp has a free slot for chunk k on every peer: data warps go
constexpr int kBarDone = 2;   // the data warps have stored chunk k: the poster may publish it
__device__ __forceinline__ void bar_sync(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(kThreads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(kThreads) : "memory");
}

// The pusher of a split one-shot channel. Warp 0 is the poster: lane p serves peer p through the
// channel's outbound verbs (BlockChannels: slot credit, then check word and tail with
// st.release.sys, which waits until the peer has acknowledged the data). Warps 1..15 move the
// data. The poster hands the data warps chunk k+1 before it publishes chunk k, so the fence of one
// chunk overlaps the stores of the next instead of stalling the whole CTA once per chunk; the tail
// counter still advances in order (one lane per peer posts them one after another).
static __device__ bool split_push(const ReduceArgs& a, BlockChannels& ch, StepShared* sh, const SplitChunks& sc,
                                  const char* in, uint64_t* pushed) {
  __shared__ int failed;
  const DeviceHandle* h = sh->h;
  const int n = h->nranks;
  const int me = h->rank;
  const int64_t K = sc.count();
  const int64_t es = a.elem_size;
  if (K == 0) return true;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const uint64_t done0 = *reinterpret_cast<volatile uint64_t*>(pushed);  // only this CTA writes it
  const bool tr = (a.flags & kArgTrace) != 0;
  const int cta = int(blockIdx.x);

  if (warp == 0) {
    // Chunk k gets a slot on every peer (sh->oslot), then the data warps may store it.
    auto hand_over = [&](int64_t k) {
      const bool ok = __all_sync(0xffffffffu, ch.outbound_credit(k));
      if (lane < n && lane != me) sh->oslot[lane] = ch.outbound_slot(k);
      if (lane == 0 && !ok) failed = 1;
      bar_arrive(kBarReady);
      return ok;
    };
    if (lane == 0) failed = 0;
    bool ok = hand_over(0);
    if (!ok) return false;
    for (int64_t k = 0; k < K; ++k) {
      bar_sync(kBarDone);  // chunk k stored (and its input read) by every data warp
      if (lane == 0) {
        st_release_gpu(pushed, done0 + uint64_t(k) + 1);
        if (3 + 2 * k < cuda_ipc::kTraceEvents - 1) trace_now(h, tr, cta, 2 + 2 * int(k));
      }
      if (k + 1 < K) ok = hand_over(k + 1);
      ch.outbound_publish(k);
      if (3 + 2 * k < cuda_ipc::kTraceEvents - 1 && lane == (me == 0 ? 1 : 0)) trace_now(h, tr, cta, 3 + 2 * int(k));
      if (!ok) return false;
    }
    ch.outbound_advance(K);  // the kernel's ch.finish() stores the channel's sent count
    __syncwarp();            // the end stamp follows every lane's last publication
    if (lane == 0) trace_now(h, tr, cta, 1);
    return true;
  }

  const int tid = int(threadIdx.x) - 32;
  const int nt = kThreads - 32;
  for (int64_t k = 0; k < K; ++k) {
    bar_sync(kBarReady);
    if (failed) return false;
    CopyJob j;
    j.src = in + sc.first(k) * es;
    j.bytes = sc.length(k) * es;
    j.nd = 0;
    for (int p = 0; p < n; ++p) {
      if (p != me) j.dst[j.nd++] = sh->oslot[p];
    }
    copy_run(&j, 1, tid, nt);
    bar_arrive(kBarDone);
  }
  return true;
}

static __device__ bool one_shot_split_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  const DeviceHandle* h = sh->h;
  const int n = h->nranks;
  const int me = h->rank;
  const uint32_t peers = peer_mask(n, me);
  const int C = gridDim.x / 2;
  const bool pusher = int(blockIdx.x) < C;
  const int b = int(blockIdx.x) % C;
  const int64_t es = a.elem_size;
  const int64_t lo = int64_t(b) * a.seg;  // the channel's range in elements
  int64_t len = a.count - lo;
  len = len < 0 ? 0 : (len > a.seg ? a.seg : len);
  const SplitChunks sc{len, a.chunk, (b & 1) != 0, (a.flags & kArgTaper) != 0};
  const int64_t K = sc.count();
  const char* in = static_cast<const char*>(a.in) + lo * es;
  char* out = static_cast<char*>(a.out) + lo * es;
  auto first = [&](int64_t k) { return sc.first(k); };
  auto length = [&](int64_t k) { return sc.length(k); };
  char* mine = h->base[me];
  uint64_t* pushed = reinterpret_cast<uint64_t*>(mine + h->layout.split.pushed_offset(b));
  uint64_t* reduced = reinterpret_cast<uint64_t*>(mine + h->layout.split.reduced_offset(b));

  const bool tr = (a.flags & kArgTrace) != 0;
  if (threadIdx.x == 0) {
    trace_now(h, tr, int(blockIdx.x), 0);
    trace_mark(h, tr, int(blockIdx.x), cuda_ipc::kTraceEvents - 1, uint64_t(K));
  }
  if (pusher) return split_push(a, ch, sh, sc, in, pushed);
  const uint64_t base = *reinterpret_cast<volatile uint64_t*>(reduced);  // only this CTA writes it
  for (int64_t k = 0; k < K; ++k) {
    bool ok = true;
    if (threadIdx.x == 64)  // warp 2: warps 0 and 1 wait for the channels meanwhile
      ok = wait_local_ge(h, pushed, base + uint64_t(k) + 1, WaitSite{a.op, b, me, cuda_ipc::kWaitLocal});
    if (!ch.acquire(0, peers, ok)) return false;
    if (threadIdx.x == 0) {
      if (3 + 2 * k < cuda_ipc::kTraceEvents - 1) trace_now(h, tr, int(blockIdx.x), 2 + 2 * int(k));
      sh->clear();
      ReduceJob& j = sh->set_reduce(length(k), a.div);
      for (int q = 0; q < n; ++q) push_src(j, q == me ? static_cast<const void*>(in + first(k) * es) : sh->islot[q]);
      push_dst(j, out + first(k) * es);
    }
    ch.execute(0, peers);
    if (threadIdx.x == 0 && 3 + 2 * k < cuda_ipc::kTraceEvents - 1) trace_now(h, tr, int(blockIdx.x), 3 + 2 * int(k));
  }
  if (threadIdx.x == 0) {
    *reduced = base + uint64_t(K);
    trace_now(h, tr, int(blockIdx.x), 1);
  }
  return true;
}

}  // namespace kernels
}  // namespace pycoll

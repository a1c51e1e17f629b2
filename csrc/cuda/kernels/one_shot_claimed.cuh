// Claimed split one-shot all-reduce: the split one-shot (one_shot.cuh: pushing and reducing CTAs
// apart, two ranks), but a pusher does not own a fixed range of the message: it claims the next
// chunk from one counter whenever it has a free slot, so channels that the link serves faster push
// more chunks and all of them run out of work at about the same moment.
//
// Why: with fixed ranges the traces of the static split showed NVLink serving the 64 pushers very
// unevenly (16 MiB: first chunks stored 9 to 41 us after the start), so the channels that were
// served last still had whole chunks to push and reduce after the others had finished.
//
//   chunk c: elements [c*chunk, min((c+1)*chunk, count)), c < nchunks.
//   pusher of channel b (warp 0 posts, warps 1..15 move data, as split_push):
//     loop: free slot k on the peer -> claim c = claim++ -> data warps store chunk c in slot k ->
//     ready[c] = 1 (this rank has read chunk c of `in`) -> publish k with tag c.
//     The claim past the end hands the data warps nothing, and message k then is the end marker
//     (tag kEndTag, no data). The call's last claim (nchunks + C - 1: every pusher makes exactly
//     one claim past the end) resets the counter to 0 for the next call.
//   reducer of channel b: loop: next message of the peer's pusher b -> its tag c (end: stop) ->
//     wait for ready[c] (in place, out[c] overwrites in[c], which this rank's pusher of chunk c
//     must have read; that pusher may be on any channel), set it back to 0 -> reduce both copies
//     in rank order into out[c].
//   Every word the call used is 0 again when it ends, so a CUDA graph can replay it; a call that
//   failed leaves them dirty, but an error ends the group anyway.
// No cycle of waits: a reducer waits for ready[c] of a chunk its peer has sent, and a pusher that
// has not yet marked a chunk ready waits only for a slot credit, i.e. for the peer's reducer of an
// older message, which holds a smaller chunk (claims grow): every chain of waits ends.
#pragma once

#include "cuda/kernels/args.h"
#include "cuda/kernels/channel.cuh"
#include "cuda/kernels/one_shot.cuh"
#include "cuda/kernels/trace.cuh"

namespace pycoll {
namespace kernels {

constexpr uint64_t kEndTag = ~uint64_t(0);

// Bounded wait for this rank's pusher of a chunk (a CTA of the same GPU).
static __device__ __noinline__ bool wait_chunk_ready(const DeviceHandle* h, const uint32_t* ready, WaitSite site) {
  if (ld_acquire_gpu_u32(ready) != 0u) return true;
  const uint64_t start = globaltimer_ns();
  for (uint32_t spin = 1;; ++spin) {
    const uint32_t v = ld_acquire_gpu_u32(ready);
    if (v != 0u) return true;
    if ((spin & 127u) == 0u && !keep_waiting(h, start, site, 1, v)) return false;
  }
}

struct ClaimedSplit {
  const DeviceHandle* h;
  uint64_t* claim;
  uint32_t* ready;
  int64_t chunk;  // elements
  int64_t nchunks;
  int64_t count;
  int64_t es;

  __device__ int64_t first(int64_t c) const { return c * chunk; }
  __device__ int64_t length(int64_t c) const { return count - c * chunk < chunk ? count - c * chunk : chunk; }
  __device__ auto tag_offset() const {
    const cuda_ipc::SplitLayout* S = &h->layout.split;
    return [S](int src, int b, int s) { return S->tag_offset(src, b, s); };
  }
};

static __device__ bool claimed_push(const ReduceArgs& a, BlockChannels& ch, StepShared* sh, const ClaimedSplit& cs) {
  __shared__ int failed;
  __shared__ int64_t next_chunk;  // what the data warps store next: a chunk, or -1 (none left)
  const DeviceHandle* h = cs.h;
  const int n = h->nranks;
  const int me = h->rank;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int C = int(gridDim.x) / 2;
  const bool tr = (a.flags & kArgTrace) != 0;
  const int cta = int(blockIdx.x);

  if (warp == 0) {
    // Message k gets a slot on every peer, then a chunk (or none: message k is the end marker).
    // Returns the chunk, -1 for the end marker, -2 if the credit wait failed.
    auto hand_over = [&](int64_t k) -> int64_t {
      const bool ok = __all_sync(0xffffffffu, ch.outbound_credit(k));
      long long c = -2;
      if (lane == 0) {
        if (ok) {
          const unsigned long long v = atomicAdd(reinterpret_cast<unsigned long long*>(cs.claim), 1ull);
          if (v == static_cast<unsigned long long>(cs.nchunks + C - 1)) *cs.claim = 0;  // the call's last claim
          c = v < static_cast<unsigned long long>(cs.nchunks) ? static_cast<long long>(v) : -1;
        } else {
          failed = 1;
        }
        next_chunk = c;
      }
      c = __shfl_sync(0xffffffffu, c, 0);
      if (lane < n && lane != me) sh->oslot[lane] = ch.outbound_slot(k);
      bar_arrive(kBarReady);
      return c;
    };
    if (lane == 0) failed = 0;
    int64_t c = hand_over(0);
    int64_t k = 0;
    while (c >= 0) {
      bar_sync(kBarDone);  // chunk c stored (and read from `in`) by every data warp
      if (lane == 0) st_release_gpu_u32(cs.ready + c, 1u);
      if (3 + 2 * k < cuda_ipc::kTraceEvents - 1 && lane == 0) trace_now(h, tr, cta, int(2 + 2 * k));
      const int64_t next = hand_over(k + 1);
      ch.outbound_tag(k, cs.tag_offset(), uint64_t(c));
      ch.outbound_publish(k);
      if (3 + 2 * k < cuda_ipc::kTraceEvents - 1 && lane == (me == 0 ? 1 : 0)) trace_now(h, tr, cta, int(3 + 2 * k));
      if (next == -2) return false;
      c = next;
      ++k;
    }
    if (c == -2) return false;
    ch.outbound_tag(k, cs.tag_offset(), kEndTag);  // message k: no chunk left
    ch.outbound_publish(k);
    ch.outbound_advance(k + 1);  // the kernel's ch.finish() stores the channel's sent count
    __syncwarp();
    if (lane == 0) {
      trace_mark(h, tr, cta, cuda_ipc::kTraceEvents - 1, uint64_t(k));
      trace_now(h, tr, cta, 1);
    }
    return true;
  }

  const int tid = int(threadIdx.x) - 32;
  const int nt = kThreads - 32;
  for (;;) {
    bar_sync(kBarReady);
    if (failed) return false;
    const int64_t c = next_chunk;
    if (c < 0) return true;
    CopyJob j;
    j.src = static_cast<const char*>(a.in) + cs.first(c) * cs.es;
    j.bytes = cs.length(c) * cs.es;
    j.nd = 0;
    for (int p = 0; p < n; ++p) {
      if (p != me) j.dst[j.nd++] = sh->oslot[p];
    }
    copy_run(&j, 1, tid, nt);
    bar_arrive(kBarDone);
  }
}

static __device__ bool claimed_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh, const ClaimedSplit& cs,
                                      int b) {
  __shared__ uint64_t tag;
  const DeviceHandle* h = cs.h;
  const int me = h->rank;
  const int peer = 1 - me;  // two ranks
  const uint32_t peers = 1u << peer;
  const bool tr = (a.flags & kArgTrace) != 0;
  const int cta = int(blockIdx.x);
  int64_t k = 0;
  for (;; ++k) {
    if (!ch.acquire(0, peers)) return false;
    bool ok = true;
    if (ch.is_inbound_lane(peer)) {
      const uint64_t t = ch.inbound_tag(cs.tag_offset());
      tag = t;
      if (t != kEndTag) {
        if (t >= uint64_t(cs.nchunks)) {
          raise_error(h, cuda_ipc::kErrOpMismatch, WaitSite{a.op, b, peer, cuda_ipc::kWaitData}, uint64_t(cs.nchunks),
                      t, 0);
          ok = false;
        } else {
          ok = wait_chunk_ready(h, cs.ready + t, WaitSite{a.op, b, me, cuda_ipc::kWaitLocal});
          cs.ready[t] = 0u;
        }
      }
    }
    if (!__syncthreads_and(ok ? 1 : 0)) return false;
    const uint64_t c = tag;
    if (c == kEndTag) {
      ch.release(0, peers);
      break;
    }
    if (threadIdx.x == 0) {
      if (3 + 2 * k < cuda_ipc::kTraceEvents - 1) trace_now(h, tr, cta, int(2 + 2 * k));
      sh->clear();
      const int64_t off = cs.first(int64_t(c)) * cs.es;
      ReduceJob& j = sh->set_reduce(cs.length(int64_t(c)), a.div);
      for (int q = 0; q < 2; ++q)
        push_src(j, q == me ? static_cast<const void*>(static_cast<const char*>(a.in) + off) : sh->islot[q]);
      push_dst(j, static_cast<char*>(a.out) + off);
    }
    ch.execute(0, peers);
    if (threadIdx.x == 0 && 3 + 2 * k < cuda_ipc::kTraceEvents - 1) trace_now(h, tr, cta, int(3 + 2 * k));
  }
  if (threadIdx.x == 0) {
    trace_mark(h, tr, cta, cuda_ipc::kTraceEvents - 1, uint64_t(k));
    trace_now(h, tr, cta, 1);
  }
  return true;
}

static __device__ bool one_shot_claimed_all_reduce(const ReduceArgs& a, BlockChannels& ch, StepShared* sh) {
  const DeviceHandle* h = sh->h;
  const int C = int(gridDim.x) / 2;
  const int b = int(blockIdx.x) % C;
  char* mine = h->base[h->rank];
  const ClaimedSplit cs{h,
                        reinterpret_cast<uint64_t*>(mine + h->layout.split.off_claim),
                        reinterpret_cast<uint32_t*>(mine + h->layout.split.ready_offset(0)),
                        a.chunk,
                        a.nchunks,
                        a.count,
                        a.elem_size};
  if (threadIdx.x == 0) trace_now(h, (a.flags & kArgTrace) != 0, int(blockIdx.x), 0);
  if (int(blockIdx.x) < C) return claimed_push(a, ch, sh, cs);
  return claimed_reduce(a, ch, sh, cs, b);
}

}  // namespace kernels
}  // namespace pycoll

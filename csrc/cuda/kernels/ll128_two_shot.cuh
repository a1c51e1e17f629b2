// LL128 two-shot all-reduce: two-shot's schedule (reduce-scatter, then all-gather) with the flags
// inside the data, after NCCL's LL128 protocol.
//
// Why: the channel two-shot (two_shot.cuh) pays at each of its two phase changes a system-scope
// fence after the data, a flag hop and the loads' ramp-up, about 5 us each on 2x H200 at 16 MiB,
// while the link idles (docs/decisions/0010-ll128-two-shot.md). Here every 128-byte line carries 120 payload bytes and
// a 64-bit flag in its last 8 bytes, written by 8 lanes of one warp with one 16-byte store each.
// NVLink delivers such a line whole, so a reader that sees the flag sees the line's payload once it
// loads the line again (the first load's other sectors may have been read before the flag's: NCCL
// reloads too). No fence, no separate flag: a line is reduced the moment it lands, and its result
// goes back at once, so the two phases overlap line by line. The price: 1/16 more bytes on the wire.
//
//   Segments: as the channel two-shot, segment q = `seg` elements (a multiple of 16 bytes) at
//     in + q*seg, owned by rank q. Line i of segment q carries its bytes [120 i, 120 i + 120).
//   Lanes: a line is 8 lanes; lane part t < 7 carries payload words 2t and 2t+1, part 7 word 14 and
//     the flag. A CTA row is 64 lines (512 threads); CTA b handles lines [lo_b, hi_b) of every
//     segment, lo_b = b * lines(segment 0) / grid, the same on every rank.
//   Phases of CTA b: header (the check word) to every peer; scatter: push lines of segment p to p
//     (phase 0 buffer); check every peer's header; reduce: for each line of my segment, wait for it
//     from every peer, reduce the n copies in rank order (mine from `in`), store to `out` and push
//     the result line to every peer (phase 1 buffer); gather: wait for every peer's result lines of
//     its segment and store them to `out`. A CTA with no line of its own segment sends an ack
//     instead, and a CTA expecting no result line from a peer waits for that peer's ack.
//   In place: the same thread reads line i of segment q (scatter, or reduce) before it writes it
//     (gather, or reduce), so `out == in` is safe.
//   Flags: each rank counts its LL128 calls in epoch[b] for every b < kLL128Blocks (local
//     workspace, loaded at the start and stored at the end: CUDA graph replays work); a call's flag
//     is that count (>= 1, the workspace starts zeroed). CTA b stores its own word and CTA 0 also
//     those of the CTAs this grid does not have, so all words stay equal although the grid changes
//     with the size: which CTA owns line i changes with it, and a per-CTA count of the CTA's own
//     calls would let a CTA match a line that another CTA left with the same count (review
//     finding). Lines of earlier calls therefore always carry smaller flags. A word is never
//     stored by a CTA that reads it in the same call.
//   Why one buffer suffices (no parity, no credits): rank A overwrites its lines in rank B's
//     buffers only in a later call, which starts after A's kernel of this call ended. That kernel
//     needed, from every CTA of B, result lines or an ack, which B sends only after it checked A's
//     header of this call and (result lines) after it read the scatter line the result is for; and
//     A's result lines into B, of which B needs all to end its call, are sent by A only after it
//     read B's scatter lines of the next call, which B sends after its kernel of this call ended.
//   Errors: a header whose check word differs raises kErrOpMismatch before any data is read; while
//     waiting for a header, a peer's unread channel message or a peer already in an LL call also
//     means the ranks called different collectives (ll_all_reduce.cuh has the same rule).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/args.h"
#include "cuda/kernels/grid_dependency.cuh"
#include "cuda/kernels/ll128_layout.h"
#include "cuda/kernels/ll_all_reduce.cuh"
#include "cuda/kernels/signal.cuh"
#include "cuda/kernels/trace.cuh"
#include "transport/cuda_ipc/device_handle.h"

namespace pycoll {
namespace kernels {

constexpr int kLL128Threads = 512;
constexpr int kLL128RowLines = kLL128Threads / 8;  // lines one CTA row covers
constexpr int kLL128Rows = 4;                      // rows a thread keeps in flight (2 for 1-byte types)
constexpr unsigned kFullWarp = 0xffffffffu;

__device__ __forceinline__ void ll128_store(void* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void ll128_load(const void* p, uint64_t& a, uint64_t& b) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

// Called by every lane of a warp (the wait ends by a warp vote). Waits until the flag word of each
// line[u] with active[u] equals `flag`, then loads those lines again into (w0, w1). False after an
// error (reported).
template <int U>
__device__ __forceinline__ bool ll128_wait(const DeviceHandle* h, const char* const (&line)[U], const bool (&active)[U],
                                           bool flag_lane, uint64_t flag, uint64_t (&w0)[U], uint64_t (&w1)[U],
                                           const WaitSite& site) {
  uint64_t start = 0;
  for (uint32_t spin = 0;; ++spin) {
    bool stale = false;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (active[u]) {
        ll128_load(line[u], w0[u], w1[u]);
        stale |= flag_lane && w1[u] != flag;
      }
    }
    if (!__any_sync(kFullWarp, stale)) break;
    if (spin == 0) start = globaltimer_ns();
    if ((spin & 127u) == 127u) {
      const uint64_t seen = __shfl_sync(kFullWarp, w1[0], 7);
      int go = 1;
      if ((threadIdx.x & 31u) == 0) go = keep_waiting(h, start, site, flag, seen) ? 1 : 0;
      if (__shfl_sync(kFullWarp, go, 0) == 0) return false;
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (active[u]) ll128_load(line[u], w0[u], w1[u]);
  return true;
}

// Warp 0 of a CTA: waits for `peer`'s header line (kind 0: check word, kind 1: ack) of this call.
// While the check header is missing, a peer with an unread channel message for this CTA or already
// in its next LL call runs a different collective: reported as a mismatch. False after an error.
__device__ __forceinline__ bool ll128_wait_header(const DeviceHandle* h, const cuda_ipc::LL128Layout& L, int peer,
                                                  int kind, uint64_t flag, uint64_t check) {
  const int lane = int(threadIdx.x & 31u);
  const char* line = h->base[h->rank] + L.header_offset(h->nranks, peer, h->rank, kind, int(blockIdx.x)) + lane * 16;
  const WaitSite site{int32_t(OpCode::AllReduce), int(blockIdx.x), peer, cuda_ipc::kWaitData};
  uint64_t start = 0;
  uint64_t moved_on_at = 0;
  uint64_t w0 = 0;
  uint64_t w1 = 0;
  for (uint32_t spin = 0;; ++spin) {
    if (lane < 8) ll128_load(line, w0, w1);
    if (!__any_sync(kFullWarp, lane == 7 && w1 != flag)) break;
    if (spin == 0) start = globaltimer_ns();
    if ((spin & 127u) == 127u) {
      int go = 1;
      if (lane == 0) {
        go = keep_waiting(h, start, site, flag, 0) ? 1 : 0;
        uint64_t theirs = 0;
        if (go && kind == 0 && peer_in_next_ll_call(h, peer, &theirs)) {
          const uint64_t now = globaltimer_ns();
          if (moved_on_at == 0) moved_on_at = now;
          if (now - moved_on_at > kLLMismatchGraceNs) {
            raise_error(h, cuda_ipc::kErrOpMismatch, site, check, theirs, now - start);
            go = 0;
          }
        }
      }
      if (kind == 0 && !ll_no_stale_messages(h, check)) go = 0;  // lane q checks peer q
      if (!__all_sync(kFullWarp, go)) return false;
    }
  }
  if (lane < 8) ll128_load(line, w0, w1);
  const uint64_t got = __shfl_sync(kFullWarp, w0, 0);
  if (kind == 0 && got != check) {
    if (lane == 0) raise_error(h, cuda_ipc::kErrOpMismatch, site, check, got, 0);
    return false;
  }
  return true;
}

template <DType D, class Op>
__global__ void __launch_bounds__(kLL128Threads, 1) ll128_two_shot_kernel(const __grid_constant__ ReduceArgs a) {
  const DeviceHandle* h = &a.h;
  const int n = h->nranks;
  const cuda_ipc::ProtocolRegion& region = h->layout.regions[a.region];  // the engine's plan names it
  const cuda_ipc::LL128Layout L = cuda_ipc::ll128_layout(region.off, region.param, n);
  const int me = h->rank;
  const int b = int(blockIdx.x);
  char* mine = h->base[me];

  uint64_t flag;  // the epoch; nothing but `a` is touched before ll_kernel_start
  if (!ll_kernel_start(h, a.check, mine + L.epoch_offset(b), flag)) return;
  const bool traced = (a.flags & kArgTrace) != 0 && threadIdx.x == 0;
  if (traced) trace_now(h, true, b, 0);

  const int64_t seg = a.seg * a.elem_size;  // bytes per segment, a multiple of 16
  const int64_t total = a.count * a.elem_size;
  auto seg_bytes = [&](int q) {
    const int64_t v = total - int64_t(q) * seg;
    return v < 0 ? int64_t(0) : (v > seg ? seg : v);
  };
  auto seg_lines = [&](int q) {
    return (seg_bytes(q) + cuda_ipc::kLL128LinePayload - 1) / cuda_ipc::kLL128LinePayload;
  };
  const int64_t lines0 = seg_lines(0);
  const int64_t lo = lines0 * b / gridDim.x;
  const int64_t hi = lines0 * (b + 1) / gridDim.x;
  auto range_end = [&](int q) {
    const int64_t e = seg_lines(q);
    return e < hi ? e : hi;
  };

  const int lane = int(threadIdx.x & 31u);
  const int part = lane & 7;
  const bool flag_lane = part == 7;
  const int64_t row_line = int64_t(threadIdx.x >> 5) * 4 + (lane >> 3);  // this thread's line in a row
  const int wa = flag_lane ? 14 : 2 * part;  // payload words of this lane (wb unused by part 7)
  const int wb = 2 * part + 1;
  const char* in = static_cast<const char*>(a.in);
  char* out = static_cast<char*>(a.out);
  const bool in_aligned = (reinterpret_cast<uintptr_t>(in) & 7u) == 0;
  const bool out_aligned = (reinterpret_cast<uintptr_t>(out) & 7u) == 0;
  constexpr int64_t P = cuda_ipc::kLL128LinePayload;
  // One-byte types keep 8 accumulators per word: 4 rows in flight spilled 1 KB of registers.
  constexpr int U = sizeof(typename DTypeTraits<D>::T) == 1 ? 2 : kLL128Rows;

  // Header to every peer: lanes 0..7 of warp 0 write one line {check, 0, ..., 0, flag}.
  if (threadIdx.x < 8) {
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      __syncwarp(0xffu);
      ll128_store(h->base[p] + L.header_offset(n, me, p, 0, b) + threadIdx.x * 16, threadIdx.x == 0 ? a.check : 0,
                  threadIdx.x == 7 ? flag : 0);
    }
  }

  // Scatter: my lines of segment p, pushed to p.
  for (int k = 1; k < n; ++k) {
    const int p = (me + k) % n;
    const int64_t end = range_end(p);
    const int64_t bytes = seg_bytes(p);
    const char* src = in + int64_t(p) * seg;
    char* dst = h->base[p];
    for (int64_t r = lo; r < end; r += int64_t(U) * kLL128RowLines) {
      uint64_t x0[U];
      uint64_t x1[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = r + int64_t(u) * kLL128RowLines + row_line;
        if (i < end) {
          x0[u] = ll_load_word(src + i * P, wa, bytes - i * P, in_aligned);
          x1[u] = flag_lane ? flag : ll_load_word(src + i * P, wb, bytes - i * P, in_aligned);
        }
      }
      // The 8 lanes of a line store it in one instruction (one 128-byte write): the byte-wise
      // loads above may have left the warp diverged.
      __syncwarp();
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = r + int64_t(u) * kLL128RowLines + row_line;
        if (i < end) ll128_store(dst + L.line_offset(n, me, p, 0, i) + part * 16, x0[u], x1[u]);
      }
    }
  }

  // Every peer's header of this call must match before any of its lines is read.
  int ok = 1;
  if (threadIdx.x < 32) {
    for (int q = 0; q < n && ok; ++q)
      if (q != me && !ll128_wait_header(h, L, q, 0, flag, a.check)) ok = 0;
  }
  if (__syncthreads_and(ok) == 0) return;

  // Reduce my segment, line by line, and push each result line to every peer.
  {
    const int64_t end = range_end(me);
    const int64_t bytes = seg_bytes(me);
    const char* own = in + int64_t(me) * seg;
    char* res = out + int64_t(me) * seg;
    if (end <= lo && threadIdx.x < 8) {  // nothing of mine here: the peers' CTA b waits for an ack
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        __syncwarp(0xffu);
        ll128_store(h->base[p] + L.header_offset(n, me, p, 1, b) + threadIdx.x * 16, 0, threadIdx.x == 7 ? flag : 0);
      }
    }
    for (int64_t r = lo; r < end; r += int64_t(U) * kLL128RowLines) {
      bool act[U];
      uint64_t o0[U];
      uint64_t o1[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = r + int64_t(u) * kLL128RowLines + row_line;
        act[u] = i < end;
        o0[u] = act[u] ? ll_load_word(own + i * P, wa, bytes - i * P, in_aligned) : 0;
        o1[u] = act[u] && !flag_lane ? ll_load_word(own + i * P, wb, bytes - i * P, in_aligned) : 0;
      }
      WordReducer<D, Op> ra[U];
      WordReducer<D, Op> rb[U];
      for (int q = 0; q < n; ++q) {
        uint64_t x0[U];
        uint64_t x1[U];
        if (q == me) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            x0[u] = o0[u];
            x1[u] = o1[u];
          }
        } else {
          const char* line[U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            x0[u] = 0;
            x1[u] = 0;
            line[u] = mine + L.line_offset(n, q, me, 0, r + int64_t(u) * kLL128RowLines + row_line) + part * 16;
          }
          const WaitSite site{int32_t(OpCode::AllReduce), b, q, cuda_ipc::kWaitData};
          if (!ll128_wait<U>(h, line, act, flag_lane, flag, x0, x1, site)) return;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (q == 0) {
            ra[u].first(x0[u]);
            rb[u].first(x1[u]);
          } else {
            ra[u].add(x0[u]);
            rb[u].add(x1[u]);
          }
        }
      }
      uint64_t y0[U];
      uint64_t y1[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        y0[u] = ra[u].result(a.div);
        y1[u] = flag_lane ? flag : rb[u].result(a.div);
      }
      __syncwarp();  // one store instruction per line, as in the scatter
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (!act[u]) continue;  // the same for the 8 lanes of a line
        const int64_t i = r + int64_t(u) * kLL128RowLines + row_line;
        for (int p = 0; p < n; ++p)
          if (p != me) ll128_store(h->base[p] + L.line_offset(n, me, p, 1, i) + part * 16, y0[u], y1[u]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (!act[u]) continue;
        const int64_t i = r + int64_t(u) * kLL128RowLines + row_line;
        ll_store_word(res + i * P, wa, bytes - i * P, out_aligned, y0[u]);
        if (!flag_lane) ll_store_word(res + i * P, wb, bytes - i * P, out_aligned, y1[u]);
      }
    }
  }

  // Gather every peer's result lines of its segment (or its ack).
  for (int k = 1; k < n; ++k) {
    const int q = (me + k) % n;
    const int64_t end = range_end(q);
    if (end <= lo) {
      if (threadIdx.x < 32 && !ll128_wait_header(h, L, q, 1, flag, a.check)) return;
      continue;
    }
    const int64_t bytes = seg_bytes(q);
    char* dst = out + int64_t(q) * seg;
    for (int64_t r = lo; r < end; r += int64_t(U) * kLL128RowLines) {
      bool act[U];
      const char* line[U];
      uint64_t x0[U];
      uint64_t x1[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = r + int64_t(u) * kLL128RowLines + row_line;
        act[u] = i < end;
        line[u] = mine + L.line_offset(n, q, me, 1, i) + part * 16;
      }
      const WaitSite site{int32_t(OpCode::AllReduce), b, q, cuda_ipc::kWaitData};
      if (!ll128_wait<U>(h, line, act, flag_lane, flag, x0, x1, site)) return;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (!act[u]) continue;
        const int64_t i = r + int64_t(u) * kLL128RowLines + row_line;
        ll_store_word(dst + i * P, wa, bytes - i * P, out_aligned, x0[u]);
        if (!flag_lane) ll_store_word(dst + i * P, wb, bytes - i * P, out_aligned, x1[u]);
      }
    }
  }
  if (threadIdx.x == 0) *reinterpret_cast<uint64_t*>(mine + L.epoch_offset(b)) = flag;
  if (b == 0) {  // the CTAs this grid does not have: their words must not fall behind
    for (int c = int(gridDim.x) + int(threadIdx.x); c < cuda_ipc::kLL128Blocks; c += int(blockDim.x))
      *reinterpret_cast<uint64_t*>(mine + L.epoch_offset(c)) = flag;
  }
  if (traced) trace_now(h, true, b, 1);
}

}  // namespace kernels
}  // namespace pycoll

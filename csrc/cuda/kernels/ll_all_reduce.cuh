// Low-latency (LL) one-shot all-reduce for small messages, after NCCL's LL protocol.
//
// The channel protocol (channel.cuh) costs every step a system-scope release fence after the data
// (the NVLink stores must be acknowledged before the flag may go out), a flag hop, and a credit
// back. For a few KiB that is most of the time. Here the flag travels inside the data: every
// 16-byte line holds 8 payload bytes and the 32-bit flag twice, {d0, flag, d1, flag}, written with
// one 16-byte store. NVLink delivers each 8-byte half whole, so a reader that sees the flag twice
// in a line it loaded in one 16-byte volatile load also sees that line's payload. No fence, no
// separate flag, no credit: one NVLink hop, twice the bytes.
//
//   Region: CTA b of every LL kernel owns region b of each (parity, sender) buffer (layout.h:
//     LLLayout), kLLBlockPayloadBytes of payload after one header line that carries the check
//     word (check_word.h). CTA b handles bytes [b * 16 KiB, (b + 1) * 16 KiB) of the message.
//   Epoch: CTA b of each rank counts the LL kernels it ran (epoch[b], local workspace, loaded at
//     the start and stored at the end: nothing travels as a kernel argument, so CUDA graph
//     replays work). The flag of a call is its epoch (never 0, the workspace's initial value);
//     the buffer is its parity.
//   Why two buffers suffice: rank A writes epoch e into parity e%2 of rank B's region b only
//     after its CTA b finished epoch e-1, which needed B's epoch e-1 lines from B's CTA b, which
//     B's kernel wrote after its epoch e-2 kernel (the last reader of parity e%2) had ended.
//   Order: every rank reduces the n copies in rank order 0..n-1 from the same values, so every
//     rank gets the same bits. The output is written only after every line and every header
//     arrived and matched, so a mismatched call raises an error without writing garbage.
//   Stale channel messages: before sending, CTA b checks that no collective message from a peer
//     is still unread in channel b of the `coll` set. At that point no peer can be past this
//     call, so an unread message belongs to an earlier call that did not match (e.g. two ranks
//     that both broadcast as root): it is reported as a mismatch, naming the stale call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/kernels/args.h"
#include "cuda/kernels/grid_dependency.cuh"
#include "cuda/kernels/signal.cuh"
#include "cuda/kernels/trace.cuh"
#include "cuda/kernels/vec.cuh"
#include "transport/cuda_ipc/device_handle.h"

namespace pycoll {
namespace kernels {

constexpr int kLLThreads = 512;
constexpr int kLLWordsPerThread = int(cuda_ipc::kLLBlockPayloadBytes / 8 / kLLThreads);  // 4
static_assert(kLLWordsPerThread * kLLThreads * 8 == cuda_ipc::kLLBlockPayloadBytes, "LL region size");

__device__ __forceinline__ void ll_store(void* line, uint64_t v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(uint32_t(v)), "r"(flag),
               "r"(uint32_t(v >> 32)), "r"(flag)
               : "memory");
}

// Bounded wait until each of the N lines at base + line[i] * 16 whose here[i] is false carries
// `flag`; payloads in v[i]. All missing lines are polled together, so their latencies overlap.
// False after an error (reported).
template <int N>
__device__ __forceinline__ bool ll_wait_lines(const DeviceHandle* h, const char* base, const int64_t (&line)[N],
                                              uint32_t flag, uint64_t (&v)[N], bool (&here)[N], const WaitSite& site) {
  uint64_t start = 0;
  uint32_t seen = 0;
  for (uint32_t spin = 0;; ++spin) {
    // Every missing line is loaded before any is looked at: one memory latency per round.
    LLRaw r[N];
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (!here[i]) r[i] = ll_load(base + line[i] * cuda_ipc::kLLLineBytes);
    bool all = true;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (here[i]) continue;
      if (r[i].f0 == flag && r[i].f1 == flag) {
        here[i] = true;
        v[i] = uint64_t(r[i].d0) | (uint64_t(r[i].d1) << 32);
      } else {
        seen = r[i].f0;
        all = false;
      }
    }
    if (all) return true;
    if (spin == 0) start = globaltimer_ns();
    if ((spin & 127u) == 127u && !keep_waiting(h, start, site, flag, seen)) return false;
  }
}

// Payload word w (bytes [8w, 8w + 8) of the message; the last one may be short, zero-padded).
__device__ __forceinline__ uint64_t ll_load_word(const char* p, int64_t w, int64_t bytes, bool aligned) {
  const int64_t off = w * 8;
  if (aligned && off + 8 <= bytes) return *reinterpret_cast<const uint64_t*>(p + off);
  uint64_t v = 0;
  const int64_t m = bytes - off < 8 ? bytes - off : 8;
  for (int64_t i = 0; i < m; ++i) v |= uint64_t(static_cast<unsigned char>(p[off + i])) << (8 * i);
  return v;
}
__device__ __forceinline__ void ll_store_word(char* p, int64_t w, int64_t bytes, bool aligned, uint64_t v) {
  const int64_t off = w * 8;
  if (aligned && off + 8 <= bytes) {
    *reinterpret_cast<uint64_t*>(p + off) = v;
    return;
  }
  const int64_t m = bytes - off < 8 ? bytes - off : 8;
  for (int64_t i = 0; i < m; ++i) p[off + i] = char((v >> (8 * i)) & 0xff);
}

// Reduction of 8-byte words of elements of type D (fp32 accumulation for fp16/bf16, as vec.cuh).
template <DType D, class Op>
struct WordReducer {
  using Tr = DTypeTraits<D>;
  using T = typename Tr::T;
  using A = typename Tr::Acc;
  static constexpr int E = 8 / int(sizeof(T));
  A acc[E];

  __device__ __forceinline__ void first(uint64_t x) {
    T e[E];
    memcpy(e, &x, 8);
#pragma unroll
    for (int i = 0; i < E; ++i) acc[i] = Tr::to_acc(e[i]);
  }
  __device__ __forceinline__ void add(uint64_t x) {
    T e[E];
    memcpy(e, &x, 8);
#pragma unroll
    for (int i = 0; i < E; ++i) acc[i] = Op::apply(acc[i], Tr::to_acc(e[i]));
  }
  __device__ __forceinline__ uint64_t result(int div) const {
    T e[E];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      A r = acc[i];
      if (div > 1) r = divide_by(r, div);
      e[i] = Tr::from_acc(r);
    }
    uint64_t v;
    memcpy(&v, e, 8);
    return v;
  }
};

// Channel b of the coll set must hold no unread message from any peer (see the file comment).
// Lane q of warp 0 checks peer q. Returns false (error reported) on a stale message.
__device__ __forceinline__ bool ll_no_stale_messages(const DeviceHandle* h, uint64_t check) {
  const int q = int(threadIdx.x);
  const int b = int(blockIdx.x);
  const cuda_ipc::ChannelSetLayout& C = h->layout.coll;
  if (q >= h->nranks || q == h->rank || b >= C.nblocks) return true;
  const char* mine = h->base[h->rank];
  const uint64_t tail = *reinterpret_cast<const volatile uint64_t*>(mine + C.tail_offset(q, b));
  const uint64_t recvd = *reinterpret_cast<const uint64_t*>(mine + C.recvd_offset(b, q));
  if (tail <= recvd) return true;
  const uint64_t stale =
      *reinterpret_cast<const volatile uint64_t*>(mine + C.check_offset(q, b, int(recvd % C.nslots)));
  raise_error(h, cuda_ipc::kErrOpMismatch, WaitSite{int32_t(OpCode::AllReduce), b, q, cuda_ipc::kWaitData}, check,
              stale, 0);
  return false;
}

// The start of the LL and LL128 kernels: wait for the previous grid and let the next one launch
// (grid_dependency.cuh: the caller touched nothing but its arguments before this), then warp 0
// loads this call's epoch (lane 0: the CTA's epoch word + 1) and checks that no message of an
// earlier call is left (lane q: peer q). `epoch` is set on every thread; false (the error
// reported) when a stale message was found: the kernel returns.
__device__ __forceinline__ bool ll_kernel_start(const DeviceHandle* h, uint64_t check, const char* epoch_word,
                                                uint64_t& epoch) {
  wait_for_previous_grid();
  let_next_grid_launch();
  __shared__ uint64_t epoch_sh;
  int ok = 1;
  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) epoch_sh = *reinterpret_cast<const uint64_t*>(epoch_word) + 1;
    ok = ll_no_stale_messages(h, check) ? 1 : 0;
  }
  if (__syncthreads_and(ok) == 0) return false;
  epoch = epoch_sh;
  return true;
}

template <DType D, class Op>
__global__ void __launch_bounds__(kLLThreads, 1) ll_all_reduce_kernel(const __grid_constant__ ReduceArgs a) {
  const DeviceHandle* h = &a.h;
  const cuda_ipc::LLLayout& L = h->layout.ll;
  const int n = h->nranks;
  const int me = h->rank;
  const int b = int(blockIdx.x);
  char* mine = h->base[me];
  const int64_t bytes = a.count * a.elem_size;
  const bool in_aligned = (reinterpret_cast<uintptr_t>(a.in) & 7u) == 0;
  const bool out_aligned = (reinterpret_cast<uintptr_t>(a.out) & 7u) == 0;

  uint64_t epoch;  // nothing but `a` is touched before ll_kernel_start
  if (!ll_kernel_start(h, a.check, mine + L.epoch_offset(b), epoch)) return;
  const bool traced = (a.flags & kArgTrace) != 0 && threadIdx.x == 0;
  if (traced) trace_now(h, true, b, 0);
  const uint32_t flag = ll_flag(epoch);
  const int parity = int(epoch & 1);

  // This thread's words: w = first + i * kLLThreads + threadIdx.x, i < nmine. Loads are issued
  // together before their values are used, so their latencies overlap.
  const int64_t nwords = (bytes + 7) / 8;
  const int64_t first = int64_t(b) * (L.block_lines - 1) + threadIdx.x;
  const int64_t left = nwords - first;
  const int nmine = left <= 0
                        ? 0
                        : (left >= int64_t(kLLWordsPerThread) * kLLThreads ? kLLWordsPerThread
                                                                           : int((left + kLLThreads - 1) / kLLThreads));
  const char* in = static_cast<const char*>(a.in);
  uint64_t own[kLLWordsPerThread];
#pragma unroll
  for (int i = 0; i < kLLWordsPerThread; ++i)
    if (i < nmine) own[i] = ll_load_word(in, first + int64_t(i) * kLLThreads, bytes, in_aligned);
  auto line_of = [&](int i) { return 1 + int64_t(i) * kLLThreads + threadIdx.x; };

  // Send: the header (thread 0) and every word, to every peer.
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    if (threadIdx.x == 0) ll_store(h->base[p] + L.line_offset(n, me, p, parity, b, 0), a.check, flag);
#pragma unroll
    for (int i = 0; i < kLLWordsPerThread; ++i)
      if (i < nmine) ll_store(h->base[p] + L.line_offset(n, me, p, parity, b, line_of(i)), own[i], flag);
  }

  // Receive: the headers (thread 0), then every word from every peer, reduced in rank order.
  int ok = 1;
  if (threadIdx.x == 0) {
    for (int q = 0; q < n && ok; ++q) {
      if (q == me) continue;
      const int64_t header[1] = {0};
      uint64_t got[1] = {0};
      bool here[1] = {false};
      const WaitSite site{int32_t(OpCode::AllReduce), b, q, cuda_ipc::kWaitData};
      if (!ll_wait_lines(h, mine + L.line_offset(n, q, me, parity, b, 0), header, flag, got, here, site)) {
        ok = 0;
      } else if (got[0] != a.check) {
        raise_error(h, cuda_ipc::kErrOpMismatch, site, a.check, got[0], 0);
        ok = 0;
      }
    }
  }
  WordReducer<D, Op> r[kLLWordsPerThread];
  for (int q = 0; q < n && ok; ++q) {
    uint64_t x[kLLWordsPerThread];
    if (q == me) {
#pragma unroll
      for (int i = 0; i < kLLWordsPerThread; ++i) x[i] = own[i];
    } else {
      int64_t line[kLLWordsPerThread];
      bool here[kLLWordsPerThread];
#pragma unroll
      for (int i = 0; i < kLLWordsPerThread; ++i) {
        line[i] = line_of(i);
        here[i] = i >= nmine;  // nothing to wait for
        x[i] = 0;
      }
      const WaitSite site{int32_t(OpCode::AllReduce), b, q, cuda_ipc::kWaitData};
      if (!ll_wait_lines(h, mine + L.line_offset(n, q, me, parity, b, 0), line, flag, x, here, site)) ok = 0;
      if (!ok) break;
    }
#pragma unroll
    for (int i = 0; i < kLLWordsPerThread; ++i) {
      if (i < nmine) {
        if (q == 0) {
          r[i].first(x[i]);
        } else {
          r[i].add(x[i]);
        }
      }
    }
  }
  if (__syncthreads_and(ok) == 0) return;

  char* out = static_cast<char*>(a.out);
#pragma unroll
  for (int i = 0; i < kLLWordsPerThread; ++i)
    if (i < nmine) ll_store_word(out, first + int64_t(i) * kLLThreads, bytes, out_aligned, r[i].result(a.div));
  if (threadIdx.x == 0) *reinterpret_cast<uint64_t*>(mine + L.epoch_offset(b)) = epoch;
  if (traced) trace_now(h, true, b, 1);
}

}  // namespace kernels
}  // namespace pycoll

// Layout of the symmetric CUDA IPC workspace. Every rank allocates one workspace of exactly this
// layout (it depends on the world size only), so an offset computed on one rank is valid in every
// peer's workspace. Plain C++ (no torch, no CUDA headers): the host class and the kernels share it.
//
// Terms
//   channel (src -> dst, block b): a FIFO of `nslots` slots of `slot_bytes` each, living in dst's
//     workspace. src writes a slot and then bumps `tail` (also in dst's workspace); dst reads the
//     slot and then bumps `head` (in src's workspace). Both counters count messages since the
//     engine was created and only grow, so a flag never needs a reset and a waiter compares with >=.
//   block b: a channel index, driven by CTA b (all_to_all: a sender and a receiver CTA per
//     channel, cuda/kernels/all_to_all_role.h). Channel b of one rank only ever talks to channel b of
//     its peers, so the channels of a kernel are independent pipelines.
//   sent/recvd: the local copies of a channel's counters (only the owning rank touches them); a
//     kernel loads them at start and stores them back at the end, which is what makes the kernels
//     replayable inside a CUDA graph (no counter travels as a kernel argument).
//
// Two channel sets exist: `coll` for collectives (issued in one stream order on every rank) and
// `p2p` for send/recv (may run concurrently with collectives, on other streams).
//
// The LL region (low latency, cuda/kernels/ll_all_reduce.cuh) is separate from the channels: small
// all-reduces write 16-byte lines that carry 8 payload bytes and two copies of a 32-bit flag, so
// the receiver needs no separate flag, no fence and no credit. Per sender and CTA it has two
// buffers (parity of the CTA's LL epoch), which is enough: see ll_all_reduce.cuh for why.
//
// Protocol regions: an all_reduce protocol registered with a region of its own
// (cuda/all_reduce_registry.h) gets `bytes` at `off`, and its kernel lays the region out itself
// from there.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define PYCOLL_HD __host__ __device__ __forceinline__
#else
#define PYCOLL_HD inline
#endif

namespace pycoll {
namespace cuda_ipc {

constexpr int kMaxRanks = 8;  // world sizes 1..8 (one host)
// kCollBlocks, kMaxCollBlocks: docs/decisions/0002-slots-ctas-and-chunks.md
constexpr int kCollBlocks = 64;      // CTAs (= channels per peer pair) a collective may use, by default
constexpr int kMaxCollBlocks = 128;  // ... and at most (PYCOLL_CUDA_MAX_BLOCKS; the workspace grows with it)
constexpr int kCollSlots = 4;        // FIFO depth of a collective channel
// The p2p set: kP2PBlocks channels per peer pair (the CTAs of the largest send/recv), kP2PSlots
// deep; the slot is the largest power of two that fits kP2PDataBudget shared by the n-1 inbound
// peers, clamped to [kMinP2PSlotBytes, kMaxP2PSlotBytes]. A message is cut by plan_p2p
// (cuda/select.h). docs/decisions/0011-p2p-channels.md
// 3..4 ranks -> 128 KiB slots (64, 96 MiB of workspace per rank and group), 5..8 -> 64 KiB.
// Two ranks (one inbound peer) -> kTwoRankP2PSlotBytes, 128 MiB, above kP2PDataBudget: chunks grow
// past 128 KiB above 32 MiB, to 512 KiB from 128 MiB (gpu::plan_p2p). docs/decisions/0017-p2p-large-slots-and-all-to-all-own-slice.md
constexpr int kP2PBlocks = 64;  // channels per peer pair of the p2p set
constexpr int kP2PSlots = 4;    // FIFO depth of a p2p channel
constexpr int64_t kP2PDataBudget = int64_t(96) << 20;
constexpr int64_t kMinP2PSlotBytes = 64 << 10;
constexpr int64_t kMaxP2PSlotBytes = 128 << 10;
constexpr int64_t kTwoRankP2PSlotBytes = 512 << 10;
// Collective slot size: the data budget below is shared by the n-1 inbound peers; the slot is the
// largest power of two that fits, clamped to [16 KiB, 256 KiB]: 2..4 ranks -> 256 KiB slots (64,
// 128, 192 MiB of workspace per rank and group), 5..7 -> 128 KiB, 8 -> 64 KiB. Every pipeline step
// of a CTA costs a few us of flags and fences, so large slots pay. make_layout() takes an explicit
// slot size instead (PYCOLL_CUDA_SLOT_KIB, see cuda_engine.cu).
// docs/decisions/0002-slots-ctas-and-chunks.md
constexpr int64_t kCollDataBudget = int64_t(192) << 20;
constexpr int64_t kMinCollSlotBytes = 16 << 10;
constexpr int64_t kMaxCollSlotBytes = 256 << 10;
// Flags written by different writers sit 128 bytes apart (no false sharing between writers).
constexpr int64_t kFlagStride = 128;

struct ChannelSetLayout {
  int32_t nblocks = 0;
  int32_t nslots = 0;
  int64_t slot_bytes = 0;
  int64_t off_tail = 0;   // in dst: [src rank][block] u64, written by src
  int64_t off_head = 0;   // in src: [dst rank][block] u64, written by dst
  int64_t off_check = 0;  // in dst: [src rank][block][slot] u64: the slot's check word (check_word.h)
  int64_t off_sent = 0;   // local: [block][peer] u64
  int64_t off_recvd = 0;  // local: [block][peer] u64
  int64_t off_data = 0;   // in dst: [peer index 0..n-2][block][slot][slot_bytes]

  PYCOLL_HD int64_t tail_offset(int src, int b) const { return off_tail + (int64_t(src) * nblocks + b) * kFlagStride; }
  PYCOLL_HD int64_t head_offset(int dst, int b) const { return off_head + (int64_t(dst) * nblocks + b) * kFlagStride; }
  PYCOLL_HD int64_t check_offset(int src, int b, int s) const {
    return off_check + ((int64_t(src) * nblocks + b) * nslots + s) * 8;
  }
  PYCOLL_HD int64_t sent_offset(int b, int peer) const { return off_sent + (int64_t(b) * kMaxRanks + peer) * 8; }
  PYCOLL_HD int64_t recvd_offset(int b, int peer) const { return off_recvd + (int64_t(b) * kMaxRanks + peer) * 8; }
  // Slot s of channel (src -> dst, block b), inside dst's workspace. The n-1 possible senders of
  // dst are packed: peer index (src - dst - 1) mod n.
  PYCOLL_HD int64_t slot_offset(int nranks, int src, int dst, int b, int s) const {
    const int pidx = (src - dst - 1 + 2 * nranks) % nranks;
    return off_data + ((int64_t(pidx) * nblocks + b) * nslots + s) * slot_bytes;
  }
};

// LL region: CTA b of every LL kernel owns region b of each (parity, sender) buffer, whatever the
// message size (a line's flag is CTA b's epoch, so a line must never change owner).
constexpr int kLLBlocks = 64;                                      // CTAs of an LL kernel at most
constexpr int64_t kLLBlockPayloadBytes = 16 << 10;                 // payload one CTA carries (8 bytes per line)
constexpr int64_t kLLMaxBytes = kLLBlocks * kLLBlockPayloadBytes;  // largest LL message: 1 MiB
constexpr int64_t kLLLineBytes = 16;

struct LLLayout {
  int32_t nblocks = 0;
  int32_t block_lines = 0;  // lines per CTA region: 1 header (the check word) + payload lines
  int64_t off_epoch = 0;    // local: [block] u64, LL kernels CTA b has run on this rank
  int64_t off_data = 0;     // in dst: [parity 2][sender index 0..n-2][block][block_lines] lines

  PYCOLL_HD int64_t epoch_offset(int b) const { return off_epoch + int64_t(b) * 8; }
  // Line `line` (0 = header) of CTA b's region written by `src` into dst's workspace.
  PYCOLL_HD int64_t line_offset(int nranks, int src, int dst, int parity, int b, int64_t line) const {
    const int pidx = (src - dst - 1 + 2 * nranks) % nranks;
    return off_data + (((int64_t(parity) * (nranks - 1) + pidx) * nblocks + b) * block_lines + line) * kLLLineBytes;
  }
};

// A registered protocol's region (cuda/all_reduce_registry.h). `param` is the registration's own
// number for its kernel (LL128: lines per sender and phase).
constexpr int kMaxProtocolRegions = 4;

// How a peer already in its next call of a registered protocol shows it, so that a collective
// waiting for that peer on a channel flag reports a mismatch at once instead of at the timeout
// (cuda/kernels/signal.cuh): this rank's count of the protocol's calls is the u64 at `epoch_off`, and
// the header that sender index i (as in the LL region) writes into this rank for its next call
// has the u64 count + 1 at `header_off + i * header_stride + flag_byte`, and its check word as the
// header's first u64. Offsets from the region's start when registered, absolute in a Layout.
struct RegionProbe {
  int64_t epoch_off = 0;
  int64_t header_off = 0;
  int64_t header_stride = 0;  // 0: no probe
  int64_t flag_byte = 0;
};

struct ProtocolRegion {
  int64_t off = 0;
  int64_t bytes = 0;  // 0: no region (the protocol is off on this engine)
  int64_t param = 0;
  RegionProbe probe;
};

// Progress of the split one-shot all_reduce (cuda/kernels/one_shot.cuh), local to each rank: for
// channel b, how many chunks its pushing CTA has sent and its reducing CTA has reduced, since the
// engine was created. Equal at every kernel start (both CTAs of a channel handle the same chunks),
// so the reducer knows how far the pusher of this call has got without a per-call reset.
//
// The claimed variant (cuda/kernels/one_shot_claimed.cuh) hands chunks to pushers from one counter
// instead: `claim` (local) is the next chunk to push, reset to 0 by the call's last claim; `tag`
// (in dst: [src rank][channel][slot] u64) tells the receiver which chunk a message holds; `ready`
// (local: [chunk] u32) is set to 1 once this rank's pusher has read a chunk of the input, and back
// to 0 by the reducer that overwrites it (in place), so every word is 0 again when a call ends.
constexpr int64_t kMaxClaimedChunks = 16384;  // a larger message runs the static split

struct SplitLayout {
  int64_t off = 0;        // local: [channel 0..kMaxCollBlocks) {pushed u64, reduced u64}
  int64_t off_claim = 0;  // local: u64
  int64_t off_tag = 0;    // in dst: [src rank][channel][slot] u64
  int64_t off_ready = 0;  // local: [chunk 0..kMaxClaimedChunks) u32
  int32_t nslots = 0;     // slots per channel (as the coll set)
  int32_t pad = 0;

  PYCOLL_HD int64_t pushed_offset(int b) const { return off + int64_t(b) * 16; }
  PYCOLL_HD int64_t reduced_offset(int b) const { return off + int64_t(b) * 16 + 8; }
  PYCOLL_HD int64_t tag_offset(int src, int b, int s) const {
    return off_tag + ((int64_t(src) * kMaxCollBlocks + b) * nslots + s) * 8;
  }
  PYCOLL_HD int64_t ready_offset(int64_t chunk) const { return off_ready + chunk * 4; }
};

// Timeline of a traced kernel (PYCOLL_CUDA_TRACE=1, cuda/kernels/trace.cuh): per CTA of a grid of up
// to kTraceCtas, kTraceEvents %globaltimer stamps (event kTraceEvents-1 holds a count, not a time),
// in a slot of the host-mapped ring of the last traced kernels (DeviceHandle::trace; CudaEngine).
// A slot: the rows, then one word per CTA that names the launch whose stamps its row holds (a
// slot is reused: a kernel of an older launch may still write into it).
constexpr int kTraceCtas = 2 * kMaxCollBlocks;
constexpr int kTraceEvents = 64;
constexpr int64_t kTraceSlotWords = int64_t(kTraceCtas) * (kTraceEvents + 1);
PYCOLL_HD int64_t trace_index(int cta, int e) { return int64_t(cta) * kTraceEvents + e; }
PYCOLL_HD int64_t trace_launch_index(int cta) { return int64_t(kTraceCtas) * kTraceEvents + cta; }

struct Layout {
  int32_t nranks = 0;
  int32_t pad = 0;
  int64_t off_abort = 0;  // u32, sticky: (origin rank + 1) | (error code << 8); peers write it too
  int64_t off_claim = 0;  // u32, local: the first error of this rank claims it and reports
  ChannelSetLayout coll;
  ChannelSetLayout p2p;
  LLLayout ll;
  SplitLayout split;
  int32_t nregions = 0;
  int32_t pad2 = 0;
  ProtocolRegion regions[kMaxProtocolRegions];  // in the registry's order
  int64_t total_bytes = 0;
};

inline int64_t round_up_i64(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

inline int64_t p2p_slot_bytes_for(int nranks) {
  if (nranks < 2) return kMinP2PSlotBytes;
  if (nranks == 2) return kTwoRankP2PSlotBytes;
  const int64_t per_slot = kP2PDataBudget / (int64_t(nranks - 1) * kP2PBlocks * kP2PSlots);
  int64_t s = kMinP2PSlotBytes;
  while (s * 2 <= per_slot && s * 2 <= kMaxP2PSlotBytes) s *= 2;
  return s;
}

inline int64_t coll_slot_bytes_for(int nranks, int coll_blocks = kCollBlocks) {
  if (nranks < 2) return kMinCollSlotBytes;
  const int64_t per_slot = kCollDataBudget / (int64_t(nranks - 1) * coll_blocks * kCollSlots);
  int64_t s = kMinCollSlotBytes;
  while (s * 2 <= per_slot && s * 2 <= kMaxCollSlotBytes) s *= 2;
  return s;
}

// `coll_slot_bytes` 0 picks coll_slot_bytes_for(nranks, coll_blocks); otherwise a multiple of 4 KiB.
// `coll_blocks`: channels per peer pair of the coll set, kCollBlocks..kMaxCollBlocks.
// `regions`: the registered protocols' regions (size, param and probe; make_layout places them).
// `p2p_slot_bytes` 0 picks p2p_slot_bytes_for(nranks); otherwise a multiple of 4 KiB.
inline Layout make_layout(int nranks, int64_t coll_slot_bytes = 0, int coll_blocks = kCollBlocks,
                          const ProtocolRegion* regions = nullptr, int nregions = 0, int64_t p2p_slot_bytes = 0) {
  Layout L;
  L.nranks = nranks;
  int64_t off = 0;
  auto take = [&off](int64_t bytes, int64_t align) {
    off = round_up_i64(off, align);
    const int64_t at = off;
    off += bytes;
    return at;
  };
  auto flags = [&](ChannelSetLayout& c, int nblocks, int nslots, int64_t slot_bytes) {
    c.nblocks = nblocks;
    c.nslots = nslots;
    c.slot_bytes = slot_bytes;
    c.off_tail = take(int64_t(kMaxRanks) * nblocks * kFlagStride, kFlagStride);
    c.off_head = take(int64_t(kMaxRanks) * nblocks * kFlagStride, kFlagStride);
    c.off_check = take(int64_t(kMaxRanks) * nblocks * nslots * 8, kFlagStride);
    c.off_sent = take(int64_t(nblocks) * kMaxRanks * 8, kFlagStride);
    c.off_recvd = take(int64_t(nblocks) * kMaxRanks * 8, kFlagStride);
  };
  L.off_abort = take(kFlagStride, kFlagStride);
  L.off_claim = take(kFlagStride, kFlagStride);
  flags(L.coll, coll_blocks, kCollSlots,
        coll_slot_bytes > 0 ? coll_slot_bytes : coll_slot_bytes_for(nranks, coll_blocks));
  flags(L.p2p, kP2PBlocks, kP2PSlots, p2p_slot_bytes > 0 ? p2p_slot_bytes : p2p_slot_bytes_for(nranks));
  const int64_t npeers = nranks > 1 ? nranks - 1 : 0;
  L.coll.off_data = take(npeers * coll_blocks * kCollSlots * L.coll.slot_bytes, 4096);
  L.p2p.off_data = take(npeers * kP2PBlocks * kP2PSlots * L.p2p.slot_bytes, 4096);
  L.ll.nblocks = kLLBlocks;
  L.ll.block_lines = int32_t(1 + kLLBlockPayloadBytes / 8);
  L.ll.off_epoch = take(int64_t(kLLBlocks) * 8, kFlagStride);
  L.split.off = take(int64_t(kMaxCollBlocks) * 16, kFlagStride);
  L.split.off_claim = take(8, kFlagStride);
  L.split.nslots = kCollSlots;
  L.split.off_tag = take(int64_t(kMaxRanks) * kMaxCollBlocks * kCollSlots * 8, kFlagStride);
  L.split.off_ready = take(kMaxClaimedChunks * 4, kFlagStride);
  L.ll.off_data = take(2 * npeers * kLLBlocks * L.ll.block_lines * kLLLineBytes, 4096);
  L.nregions = nregions;
  for (int i = 0; i < nregions && i < kMaxProtocolRegions; ++i) {
    if (regions[i].bytes <= 0 || npeers == 0) continue;  // off: all zero, no probe
    ProtocolRegion& r = L.regions[i];
    r = regions[i];
    r.off = take(r.bytes, 4096);
    if (r.probe.header_stride > 0) {
      r.probe.epoch_off += r.off;
      r.probe.header_off += r.off;
    }
  }
  L.total_bytes = round_up_i64(off, 2 << 20);
  return L;
}

}  // namespace cuda_ipc
}  // namespace pycoll

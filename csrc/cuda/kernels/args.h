// Kernel arguments, shared by the host launcher (cuda_engine.cu) and the kernels. Plain structs
// passed by value; no torch, no CUDA headers.
#pragma once

#include <cstdint>

#include "common/types.h"
#include "transport/cuda_ipc/device_handle.h"

namespace pycoll {
namespace kernels {

// Reduce operations the kernels implement. Avg, Bool and Int8 bitwise ops are mapped onto these by
// the host (cuda_engine.cu: kernel_type).
enum class ReduceOp : int32_t { Sum = 0, Prod = 1, Min = 2, Max = 3, And = 4, Or = 5, Xor = 6 };

// What the reduce kernel runs.
enum class ReduceMode : int32_t {
  AllReduceOneShot = 0,
  AllReduceTwoShot = 1,
  AllReduceRing = 2,
  AllReduceTree = 3,
  ReduceScatterDirect = 4,
  ReduceScatterRing = 5,
  ReduceDirect = 6,
  AllReduceOneShotSplit = 7,  // grid = 2 x channels: pushers, then reducers (one_shot.cuh)
};

// Copy kernels (no dtype).
enum class CopyMode : int32_t {
  AllGatherDirect = 0,
  AllGatherRing = 1,
  Broadcast = 2,
  AllToAll = 3,
  Barrier = 4,
};

// ReduceArgs::flags.
constexpr int32_t kArgTrace = 1;    // record the kernel's timeline (PYCOLL_CUDA_TRACE, cuda/kernels/trace.cuh)
constexpr int32_t kArgTaper = 2;    // split one-shot: cut the last chunk of a channel at half a chunk
constexpr int32_t kArgClaimed = 4;  // split one-shot: pushers claim chunks from one counter (one_shot_claimed.cuh)
constexpr int32_t kArgWaves =
    8;  // two-shot all_reduce: the second half of the CTAs starts after the first (two_shot.cuh)

// Elements are of the kernel's dtype. Segment-based modes (two-shot, ring, reduce-scatter) view
// `in` as nranks segments: segment q starts at q * seg and holds clamp(count - q*seg, 0, seg)
// elements; segment q's result goes to out + q * out_stride (out_stride 0: reduce-scatter, where
// only the own segment is written). Chunk c is the slice [c*chunk, (c+1)*chunk) of every segment
// (of the whole tensor for one-shot, tree, reduce); CTA b handles chunks b, b+B, b+2B, ...
// Claimed split one-shot (kArgClaimed): nchunks chunks of `chunk` elements (the last may be short),
// taken by whichever pusher is free (cuda/kernels/one_shot_claimed.cuh).
struct ReduceArgs {
  cuda_ipc::DeviceHandle h;
  ReduceMode mode;
  int32_t op;  // pycoll::OpCode, for error reports
  const void* in;
  void* out;
  int64_t count;
  int64_t seg;
  int64_t out_stride;
  int64_t chunk;
  int64_t nchunks;
  int32_t root;       // ReduceDirect
  int32_t div;        // Avg: world size; else 1
  int32_t elem_size;  // bytes per element of `dtype`
  DType dtype;        // element type (never Bool: the host maps it to UInt8)
  ReduceOp rop;       // reduce operation (bitwise ones only for UInt8, Int32, Int64)
  int32_t flags;      // kArgTrace | kArgTaper | kArgClaimed | kArgWaves
  int32_t region;     // a registered protocol's kernel: its index in h.layout.regions
  int32_t pad;
  // Tree: per tree t (0, 1): parent (-1 at the root) and up to two children (-1 if none).
  int32_t tree_parent[2];
  int32_t tree_child[2][2];
  uint64_t check;  // what every rank must have called (transport/cuda_ipc/check_word.h)
};

// Byte-based modes. All-gather: `bytes` per rank, out = nranks * bytes. Broadcast: `bytes` of
// `out` (in place), from `root`. All-to-all: per-peer byte counts/offsets; chunk = slot size and
// chunk j of a pair goes through channel j % (channels per pair) (cuda/kernels/all_to_all_role.h).
struct CopyArgs {
  cuda_ipc::DeviceHandle h;
  CopyMode mode;
  int32_t op;
  const void* in;
  void* out;
  int64_t bytes;
  int64_t chunk;
  int64_t nchunks;
  int32_t root;
  int32_t pad;
  int64_t send_bytes[cuda_ipc::kMaxRanks];
  int64_t send_off[cuda_ipc::kMaxRanks];
  int64_t recv_bytes[cuda_ipc::kMaxRanks];
  int64_t recv_off[cuda_ipc::kMaxRanks];
  uint64_t check;  // what every rank must have called (transport/cuda_ipc/check_word.h)
};

// Point-to-point on the p2p channel set. Chunk j (of `chunk` bytes) goes through CTA j % blocks
// (gpu::plan_p2p: both ends derive chunk and blocks from the message length alone).
struct P2PArgs {
  cuda_ipc::DeviceHandle h;
  int32_t peer;
  int32_t is_send;
  void* buf;
  int64_t bytes;
  int64_t chunk;
  int64_t nchunks;
  int32_t blocks;
  int32_t flags;  // kP2PGate, kP2PTrace
};

// A receive's gate (one CTA, before the receive's own launch on the same stream): returns once
// the message's first chunk is in channel 0, consuming nothing. A receive posted before its send
// then waits on one SM instead of all of its CTAs. gpu::p2p_gate.
constexpr int32_t kP2PGate = 1;
constexpr int32_t kP2PTrace = 2;  // stamp the timeline (PYCOLL_CUDA_TRACE, cuda/kernels/trace.cuh)

// Several sends and receives in one launch (a coalesced batch_isend_irecv, gpu::plan_p2p_batch):
// op i runs on CTAs first_block .. first_block + blocks - 1, cut as that message alone would be
// (its CTA k drives channel k of its pair), so a peer that posts the same messages one by one
// agrees on every chunk. At most one send and one receive per peer: two messages of one direction
// of a pair share channels and must run one after the other. A message of no bytes takes one CTA
// (its empty chunk carries the length to the receiver).
constexpr int kMaxP2PBatchOps = 2 * (cuda_ipc::kMaxRanks - 1);

struct P2PBatchOp {
  void* buf;
  int64_t bytes;
  int64_t chunk;
  int64_t nchunks;
  int32_t peer;
  int32_t is_send;
  int32_t blocks;
  int32_t first_block;
};

struct P2PBatchArgs {
  cuda_ipc::DeviceHandle h;
  int32_t nops;
  int32_t pad;
  P2PBatchOp ops[kMaxP2PBatchOps];
};

}  // namespace kernels
}  // namespace pycoll

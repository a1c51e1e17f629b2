// A batched memcpy plan: many (source, destination, bytes) copies cut into
// chunks of at most kCopyChunkBytes, so that one parallel loop (CPU) or one
// kernel launch (CUDA, one block per chunk) moves all of them. Used by the
// fused bucketing calls flatten_into / unflatten_from. No torch here.
//
// Terms
//   piece: one tensor's bytes, contiguous on both sides.
//   chunk: a slice of a piece, the unit of work (one task / one CUDA block).
#pragma once

#include <cstdint>
#include <vector>

namespace pycoll {

// 64 KiB per chunk: large enough that a chunk's setup is negligible, small
// enough that a 25 MiB bucket spreads over hundreds of blocks / tasks.
constexpr int64_t kCopyChunkBytes = 64 << 10;

struct CopyChunk {
  const char* src;
  char* dst;
  int64_t bytes;
};

// Appends the chunks of one piece to `plan`.
inline void plan_copy(std::vector<CopyChunk>& plan, const void* src, void* dst, int64_t bytes) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (int64_t off = 0; off < bytes; off += kCopyChunkBytes) {
    const int64_t n = bytes - off < kCopyChunkBytes ? bytes - off : kCopyChunkBytes;
    plan.push_back({s + off, d + off, n});
  }
}

}  // namespace pycoll

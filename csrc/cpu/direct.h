// Direct algorithms over the shared data regions: every rank publishes its
// chunk in its own half, one barrier, then every rank reads what it needs
// straight from its peers' halves. Few steps, so best for small messages; large
// all_reduce, all_gather, reduce_scatter and broadcast run pipelined instead
// (cpu/pipelined.h).
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/context.h"

namespace pycoll {

// One-shot all-reduce: each rank reduces the whole chunk from every peer in
// rank order 0..n-1. `first_published` means the engine already copied the
// first chunk in before its header barrier (saves one barrier for small ops).
void oneshot_all_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count,
                        bool first_published);
// Bytes of input that fit one one-shot chunk (the engine's eager publish uses it).
int64_t oneshot_chunk_elems(const CpuContext& c, DType t);

// in: m elements; out: n*m, block r from rank r.
void direct_all_gather(CpuContext& c, DType t, const char* in, char* out, int64_t m);
// in: n*m elements; out: m, the reduction of every rank's block `rank`.
void direct_reduce_scatter(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t m);
void direct_broadcast(CpuContext& c, DType t, char* buf, int64_t count, int root);
// out is written on root only.
void direct_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count, int root);
// in: m elements from every rank; out (root only): n*m.
void direct_gather(CpuContext& c, DType t, const char* in, char* out, int64_t m, int root);
// in (root only): n*m; out: m.
void direct_scatter(CpuContext& c, DType t, const char* in, char* out, int64_t m, int root);
// Byte-level all-to-all; `max_block` is the largest block any rank sends.
void direct_all_to_all(CpuContext& c, const char* in, char* out, const std::vector<int64_t>& send_bytes,
                       const std::vector<int64_t>& send_off, const std::vector<int64_t>& recv_bytes,
                       const std::vector<int64_t>& recv_off, int64_t max_block);

}  // namespace pycoll

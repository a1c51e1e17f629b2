// Large CPU all_gather, reduce_scatter and broadcast that read each peer's buffer in place with
// cross-memory attach (process_vm_readv) instead of staging it through the shared data region.
//
// Staged, a byte a peer needs is copied twice (into my slot, then out of it by the peer); read in
// place it is copied once, by the kernel, straight from my buffer into the peer's output. That
// is what the memory floor of pycoll-bench assumes, and staging cannot reach it: the least staged
// all_gather costs 1.5x the floor (benchmarks/cpu_peer_pull.c). The kernel pins the peer's pages
// on every call, which costs more than the copy it saves except for large all_gathers on ranks
// with many threads, so the engine reads in place only there by default (the CPU plan,
// PYCOLL_CPU_PEER_READ). A reduce_scatter gains more: staged, the peers' blocks are copied into my
// slots and out again (with 2 ranks 2.5 B of traffic for an input of B, against the floor's
// 1.5 B); read in place, each arrives once, into a small cached buffer, and is reduced from there.
// So large reduce_scatters read in place by default too. docs/decisions/0022-cpu-peer-read-rule.md
//
// Every rank publishes its buffer's address in its op header (OpHeader::addr) and its process id
// in its control block. A rank's buffer must stay valid until every peer has read it: the
// caller ends the op with a barrier.
#pragma once

#include <cstdint>

#include "cpu/pipelined.h"
#include "common/types.h"
#include "cpu/kernels/reduce.h"

namespace pycoll {

// Whether this process may read (one byte) at `remote` in process `pid`; on failure *err is errno.
bool can_read_peer(int64_t pid, const void* remote, int* err);

// all_gather of m elements per rank: my block from `in`, every peer's read from its `in`
// (addrs[r], the address in rank r's process). in may be my block of out.
void peer_read_all_gather(Pipeline& p, const int64_t* addrs, DType t, const char* in, char* out, int64_t m);

// reduce_scatter of m elements per rank: out = block `me` of every rank's `in` (addrs[r]), reduced
// in rank order. The peers' blocks come in chunks of kPeerReadChunkBytes into a per-thread buffer
// that stays in cache while it is reduced. out may be my block of in.
void peer_read_reduce_scatter(Pipeline& p, const ReduceSpec& spec, const int64_t* addrs, const char* in, char* out,
                              int64_t m);

// broadcast of count elements: every rank but the root reads the root's buffer into buf.
void peer_read_broadcast(Pipeline& p, const int64_t* addrs, DType t, char* buf, int64_t count, int root);

}  // namespace pycoll

// Pipelined algorithms for large messages on shared memory.
//
// The direct algorithms copy a whole 4-8 MiB chunk into shared memory, wait at a barrier, and
// read it back: every byte goes through memory three times, and a barrier separates the phases.
// These move the message through a ring of small slots (64 KiB per peer) in each rank's data
// region instead, one step per chunk, with per-step counters in place of barriers: the slots
// stay in the shared cache, so the user's buffers are read once and written once from memory,
// and ranks overlap their phases. docs/decisions/0024-cpu-pipelined-from-256-kib.md
//
// Terms:
//   lane  - a thread's share of the op: a contiguous part of every rank's slice, with its own
//           part of each data region and its own counters (ControlBlock::lanes). Lane t of every
//           rank talks only to lane t of its peers, so lanes never wait on each other.
//   step  - one chunk of a lane; steps are numbered by an ever-growing counter per lane that
//           every rank advances identically, and slot = step % kSlots.
//   slot  - the shared memory of one step: one sub-slot per peer (what I staged for it) and,
//           for all_reduce, one for the chunk I reduced.
// A rank writes its slot for step g only after every peer has consumed step g - kSlots, and an
// op returns only after every peer has consumed all its steps, so the next op may use any slot.
#pragma once

#include <cstdint>
#include <functional>

#include "cpu/context.h"
#include "cpu/lane_pool.h"

namespace pycoll {

struct Pipeline {
  Transport& t;
  Waiter& w;
  uint64_t* lane_step;  // kMaxLanes counters, identical on every rank
  int lanes;            // agreed by every rank
  LanePool* pool;       // runs lanes 1..; may be null when lanes == 1
  bool stream_out;  // all_gather: write the user's output with streaming stores (cpu/kernels/stream_store.h); per rank
};

// Lanes worth using for a message of `bytes` over `ranks` ranks (each lane should move at least
// min_lane_bytes(ranks) in pipelined.cpp), given the threads every rank offers.
int pipeline_lanes(size_t bytes, int ranks, int threads);

// Runs lane(0..p.lanes-1), lanes 1.. on p.pool; returns when all have returned.
void run_lanes(Pipeline& p, const std::function<void(int)>& lane);

// in/out may be the same buffer. Slice r of the message is reduced by rank r, in rank order
// 0..n-1, so every rank gets the same bits.
void pipelined_all_reduce(Pipeline& p, const ReduceSpec& spec, const char* in, char* out, int64_t count);
// in: n*m elements; out: m, the reduction of every rank's block `rank`.
void pipelined_reduce_scatter(Pipeline& p, const ReduceSpec& spec, const char* in, char* out, int64_t m);
// in: m elements; out: n*m, block r from rank r.
void pipelined_all_gather(Pipeline& p, DType t, const char* in, char* out, int64_t m);
void pipelined_broadcast(Pipeline& p, DType t, char* buf, int64_t count, int root);

}  // namespace pycoll

// Pipelined binary-tree reduce and broadcast over the shared data regions.
//
// Terms: ranks are renumbered relative to the root (v = (rank - root) mod n);
// v's children are 2v+1 and 2v+2. A segment is the unit that moves one tree
// level per step, so successive segments overlap across levels (pipelining).
// Reduce: a node adds its children's partials (acc type) to its own input
// and publishes the result in its up slot; the root writes the final value.
// Broadcast: the root publishes each segment in its down slot; every node
// copies its parent's slot into its output and, if it has children, into its
// own down slot. Slots are double-buffered by segment parity.
#pragma once

#include <cstdint>

#include "cpu/context.h"

namespace pycoll {

// out is written on root only; in may alias out.
void tree_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count, int root);
void tree_broadcast(CpuContext& c, DType t, char* buf, int64_t count, int root);
// Reduce to rank 0, then broadcast from rank 0: every rank gets rank 0's bits.
void tree_all_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count);

}  // namespace pycoll

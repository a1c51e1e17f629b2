// State that every CPU algorithm of one group shares, and the terms they use.
//
// Terms:
//   half   - the data region of each rank is split in two halves used
//            alternately ("phase" parity), one per chunk. A rank writes into
//            half h only after a barrier that every peer reached after its
//            last read of h, so one barrier per chunk suffices.
//   chunk  - the part of an op that fits into one half; large ops loop.
//   step   - ring/tree hand-offs, numbered by ever-growing counters that all
//            ranks advance identically (ring_step, up_step, down_step).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/sync.h"
#include "cpu/kernels/reduce.h"
#include "transport/transport.h"

namespace pycoll {

struct CpuContext {
  Transport& t;
  Waiter& w;
  uint64_t& barrier_epoch;
  uint64_t& phase;
  uint64_t& ring_step;
  uint64_t& up_step;
  uint64_t& down_step;

  int rank() const { return t.rank(); }
  int size() const { return t.size(); }
  size_t half_bytes() const { return (t.data_bytes() / 2) & ~size_t(63); }
  char* half(int r) const { return t.data(r) + (phase & 1) * half_bytes(); }
  void barrier() { w.barrier(barrier_epoch); }
};

// [begin, end) of part i when `count` items are split into n nearly equal parts.
inline int64_t part_begin(int64_t count, int n, int i) { return count * i / n; }
inline int64_t part_end(int64_t count, int n, int i) { return count * (i + 1) / n; }

}  // namespace pycoll

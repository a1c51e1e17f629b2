// Ring algorithms over the shared data regions.
//
// Terms: the chunk is split into n segments; segment j is finally owned by
// rank j. In the reduce-scatter pass, at step st (0..n-2) rank r sends the
// partial of segment (r-1-st) mod n to its right neighbour through its own
// slot; the right neighbour adds its input and forwards. Partials travel in
// the acc type (fp32 for fp16/bf16). In the all-gather pass the finished
// segments travel around the ring the same way. Each slot is double-buffered
// by step parity; a rank reuses a slot once its right neighbour's
// ring_consumed counter shows the older message was read.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/context.h"

namespace pycoll {

struct RingSegments {
  std::vector<const char*> in;  // rank's own input for segment j
  std::vector<char*> out;       // where segment j lands on this rank
  std::vector<int64_t> len;     // elements in segment j
};

void ring_all_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count);
// in: n*m elements; out: m.
void ring_reduce_scatter(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t m);
// in: m elements; out: n*m.
void ring_all_gather(CpuContext& c, DType t, const char* in, char* out, int64_t m);

}  // namespace pycoll

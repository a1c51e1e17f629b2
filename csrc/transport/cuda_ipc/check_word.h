// The word every message slot carries next to its data, which the receiver compares with its own
// before it reads the slot (channel.cuh: acquire).
//   p2p:         the total length of the message in bytes (a recv of another size fails).
//   collectives: what every rank must have called: op, element type, reduce op, root and element
//                count. Ranks that called a collective with different sizes (or dtypes, ops, roots)
//                then fail with an error that names both calls, instead of returning garbage or
//                timing out. All-to-all leaves the count out (its per-peer sizes differ legally).
// Collective layout: op 8 bits | dtype 4 | reduce op 4 | root 4 | count 44 (up to 16 Ti elements).
// No torch, no CUDA headers.
#pragma once

#include <cstdint>

#include "transport/cuda_ipc/layout.h"  // PYCOLL_HD

namespace pycoll {
namespace cuda_ipc {

constexpr int kCheckCountBits = 44;

PYCOLL_HD uint64_t collective_check_word(int op, int dtype, int reduce_op, int root, int64_t count) {
  const uint64_t mask = (uint64_t(1) << kCheckCountBits) - 1;
  return (uint64_t(op & 0xff) << 56) | (uint64_t(dtype & 0xf) << 52) | (uint64_t(reduce_op & 0xf) << 48) |
         (uint64_t(root & 0xf) << kCheckCountBits) | (uint64_t(count) & mask);
}

struct CollectiveCheck {
  int op, dtype, reduce_op, root;
  int64_t count;
};

inline CollectiveCheck decode_check_word(uint64_t w) {
  return CollectiveCheck{int(w >> 56), int((w >> 52) & 0xf), int((w >> 48) & 0xf),
                         int((w >> kCheckCountBits) & 0xf), int64_t(w & ((uint64_t(1) << kCheckCountBits) - 1))};
}

}  // namespace cuda_ipc
}  // namespace pycoll

// Which side of which pair CTA b of an all_to_all serves (cuda/kernels/all_to_all.cuh). Plain C++ so
// that the host tests the mapping (bindings/cuda_plan_bindings.cpp).
//
//   C = grid / 2 slots; the n-1 pairs of a rank get Cp = C / (n-1) channels each; CTA 2i sends on
//   channel i / (n-1) to the (i mod (n-1))-th peer after this rank, CTA 2i+1 receives on it from
//   the (i mod (n-1))-th peer before it; the last C mod (n-1) slots idle.
#pragma once

#include "transport/cuda_ipc/layout.h"  // PYCOLL_HD

namespace pycoll {
namespace kernels {

struct AllToAllRole {
  int chan;      // channel of the pair
  int channels;  // Cp: channels per pair
  int peer;      // < 0: this CTA serves no pair (a receiving one still copies its share of the own slice)
  bool sender;
};

PYCOLL_HD AllToAllRole all_to_all_role(int n, int me, int grid, int b) {
  const int np = n > 1 ? n - 1 : 1;
  const int C = grid / 2;
  const int i = b / 2;
  AllToAllRole r;
  r.channels = C / np;
  r.chan = i / np;
  r.sender = (b % 2) == 0;
  const int pi = i % np;
  r.peer = (n < 2 || r.chan >= r.channels) ? -1 : (r.sender ? (me + 1 + pi) % n : (me + 2 * n - 1 - pi) % n);
  return r;
}

}  // namespace kernels
}  // namespace pycoll

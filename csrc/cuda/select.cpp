// Cost model of the CUDA engine: time = launch + hops * hop latency + wire bytes / link bandwidth
// + local bytes / memory bandwidth, per algorithm (docs/algorithms.md gives the steps and bytes).
//
// PROVISIONAL: none of these constants has been measured on the device yet. They come from the
// anchors of DESIGN.md section 4 (2x H200 NVLink, torch 2.11 + NCCL: NCCL all_reduce ~33 us
// floor, 323 GB/s busbw at 1 GiB) and NVIDIA's published H100 figures (NVLink4 450 GB/s per
// direction, HBM3 3.35 TB/s). Replace each with a measurement (pycoll-bench on 2x H100/H200, note
// the date and card here) before trusting the crossovers.
#include "cuda/select.h"

#include <algorithm>
#include <limits>

namespace pycoll {
namespace gpu {

namespace {

constexpr CostConstants kCost{
    /*launch_us=*/3.0,        // provisional: kernel launch + first CTA scheduled, us
    /*hop_us=*/1.5,           // provisional: one flag hop over NVLink incl. the sender's fence.sys, us
    /*link_gbps=*/350.0,      // provisional: NVLink4 achievable per direction per GPU, GB/s (peak 450)
    /*hbm_gbps=*/2500.0,      // provisional: local read+write streaming of copy/reduce, GB/s
    /*min_chunk_bytes=*/8192  // provisional: smallest chunk handed to one CTA (512 threads x 16 B)
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

int ceil_log2(int n) {
  int d = 0;
  while ((1 << d) < n) ++d;
  return d;
}

}  // namespace

const CostConstants& cost_constants() { return kCost; }

Geometry plan_geometry(int64_t elems, int64_t elem_bytes, int64_t slot_bytes, int max_blocks) {
  Geometry g;
  const int64_t pack = std::max<int64_t>(1, 16 / elem_bytes);
  const int64_t max_chunk = std::max<int64_t>(pack, slot_bytes / elem_bytes / pack * pack);
  if (elems <= 0) {
    g.blocks = 1;
    g.chunk = max_chunk;
    g.nchunks = 0;
    return g;
  }
  const int64_t bytes = elems * elem_bytes;
  int64_t blocks = std::min<int64_t>(max_blocks, ceil_div(bytes, kCost.min_chunk_bytes));
  blocks = std::max<int64_t>(1, blocks);
  int64_t chunk = round_up(ceil_div(elems, blocks), pack);
  chunk = std::min(chunk, max_chunk);
  g.chunk = chunk;
  g.nchunks = ceil_div(elems, chunk);
  g.blocks = int(std::min<int64_t>(blocks, g.nchunks));
  return g;
}

double predict_us(OpCode op, Algo algo, int64_t bytes, int nranks) {
  const double n = nranks;
  const double N = double(bytes);
  const double link = kCost.link_gbps * 1e3;  // bytes per us
  const double hbm = kCost.hbm_gbps * 1e3;
  const double L = kCost.launch_us;
  const double h = kCost.hop_us;
  if (nranks <= 1) return L + N / hbm;
  switch (op) {
    case OpCode::AllReduce:
      switch (algo) {
        case Algo::OneShot:  // one hop; (n-1)N out; read n copies, write 1
          return L + h + (n - 1) * N / link + (n + 1) * N / hbm;
        case Algo::TwoShot:  // two hops; 2(n-1)/n N out
          return L + 2 * h + 2 * (n - 1) / n * N / link + 3 * N / hbm;
        case Algo::Ring:  // 2(n-1) hops per chunk
          return L + 2 * (n - 1) * h + 2 * (n - 1) / n * N / link + 3 * N / hbm;
        case Algo::Tree:  // up and down the depth of the tree; ~N out per rank
          return L + 2 * ceil_log2(nranks) * h + N / link + 3 * N / hbm;
        case Algo::Auto: break;
      }
      break;
    case OpCode::ReduceScatter:
    case OpCode::AllGather:
      // `bytes` is one rank's share: (n-1) shares leave each rank either way.
      if (algo == Algo::Ring) return L + (n - 1) * h + (n - 1) * N / link + 2 * n * N / hbm;
      return L + h + (n - 1) * N / link + 2 * n * N / hbm;
    default:
      break;
  }
  return std::numeric_limits<double>::infinity();
}

Algo choose_all_reduce(int64_t bytes, int nranks) {
  Algo best = Algo::OneShot;
  double best_us = predict_us(OpCode::AllReduce, best, bytes, nranks);
  for (Algo a : {Algo::TwoShot, Algo::Ring}) {  // ties keep the earlier (lower latency) one
    const double t = predict_us(OpCode::AllReduce, a, bytes, nranks);
    if (t < best_us) {
      best = a;
      best_us = t;
    }
  }
  return best;
}

Algo choose_reduce_scatter(int64_t bytes_per_rank, int nranks) {
  // Direct moves the same bytes as the ring in one hop instead of n-1 on an NVSwitch/NVLink
  // clique, so it wins at every size in this model.
  return predict_us(OpCode::ReduceScatter, Algo::Ring, bytes_per_rank, nranks) <
                 predict_us(OpCode::ReduceScatter, Algo::OneShot, bytes_per_rank, nranks)
             ? Algo::Ring
             : Algo::OneShot;
}

Algo choose_all_gather(int64_t bytes_per_rank, int nranks) {
  return predict_us(OpCode::AllGather, Algo::Ring, bytes_per_rank, nranks) <
                 predict_us(OpCode::AllGather, Algo::OneShot, bytes_per_rank, nranks)
             ? Algo::Ring
             : Algo::OneShot;
}

}  // namespace gpu
}  // namespace pycoll

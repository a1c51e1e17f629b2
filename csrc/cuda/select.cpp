// Cost model of the CUDA engine: time = launch + hops * hop latency + wire bytes / link bandwidth
// + local bytes / memory bandwidth, per algorithm (docs/algorithms.md gives the steps and bytes).
//
// Fitted by hand to one run of 2 H200: the latency terms lump launch, fences and __syncthreads of
// each step, hence hop_us well above the raw NVLink flag latency. Only 2 ranks were measured: the
// n-dependence is the model's, provisional for n > 2 and on H100 (pycoll-bench --calibrate measures
// the winners per size, which then replace these choices: measured_choices.h).
// docs/decisions/0027-cuda-cost-model.md
#include "cuda/select.h"

#include "common/arith.h"
#include "cuda/measured_choices.h"

#include <algorithm>
#include <limits>

namespace pycoll {
namespace gpu {

namespace {

struct CostConstants {
  double launch_us;
  double hop_us;
  double link_gbps;
  double hbm_gbps;
  int64_t min_chunk_bytes;
};

constexpr CostConstants kCost{
    /*launch_us=*/6.0,        // us: launch + the first and last step of a kernel (2x H200, fitted)
    /*hop_us=*/5.5,           // us: one more dependent step (flag hop + fence + syncs) (2x H200, fitted)
    /*link_gbps=*/445.0,      // GB/s per direction per GPU on the wire (2x H200, fitted; NVLink4 peak 450)
    /*hbm_gbps=*/3060.0,      // GB/s of local copy/reduce traffic (2x H200, fitted)
    /*min_chunk_bytes=*/8192  // bytes: smallest chunk handed to one CTA (512 threads x 16 B); not tuned
};

int ceil_log2(int n) {
  int d = 0;
  while ((1 << d) < n) ++d;
  return d;
}

}  // namespace

Geometry plan_geometry(int64_t elems, int64_t elem_bytes, int64_t max_chunk_bytes, int max_blocks,
                       int small_max_blocks) {
  Geometry g;
  const int64_t pack = std::max<int64_t>(1, 16 / elem_bytes);
  const int64_t max_chunk = std::max<int64_t>(pack, max_chunk_bytes / elem_bytes / pack * pack);
  if (elems <= 0) {
    g.blocks = 1;
    g.chunk = max_chunk;
    g.nchunks = 0;
    return g;
  }
  const int64_t bytes = elems * elem_bytes;
  if (bytes <= kSmallMessageBytes) max_blocks = std::min(max_blocks, small_max_blocks);
  int64_t blocks = std::min<int64_t>(max_blocks, ceil_div(bytes, kCost.min_chunk_bytes));
  blocks = std::max<int64_t>(1, blocks);
  int64_t chunk = round_up(ceil_div(elems, blocks), pack);
  chunk = std::min(chunk, max_chunk);
  g.chunk = chunk;
  g.nchunks = ceil_div(elems, chunk);
  g.blocks = int(std::min<int64_t>(blocks, g.nchunks));
  return g;
}

Geometry plan_p2p(int64_t bytes, int64_t p2p_slot_bytes, int p2p_channels, int sms, int most_blocks) {
  const int64_t max_blocks = std::max(1, std::min({most_blocks, p2p_channels, std::max(1, (sms - kSmHeadroom) / 2)}));
  Geometry g;
  g.chunk = p2p_slot_bytes;
  g.nchunks = 1;  // a message of no bytes is one empty chunk: it carries its length to the receiver
  g.blocks = 1;
  if (bytes <= 0) return g;
  const int64_t floor = std::min(kP2PMinChunkBytes, p2p_slot_bytes);
  g.chunk =
      std::clamp(round_up(ceil_div(bytes, max_blocks * kP2PChunksPerBlock), int64_t(4096)), floor, p2p_slot_bytes);
  g.nchunks = ceil_div(bytes, g.chunk);
  g.blocks = int(std::min(max_blocks, g.nchunks));
  return g;
}

P2PBatchPlan plan_p2p_batch(const std::vector<P2PBatchItem>& items, int max_ops, int64_t p2p_slot_bytes,
                            int p2p_channels, int sms, int max_blocks) {
  P2PBatchPlan plan;
  plan.geometry.reserve(items.size());
  plan.first_block.assign(items.size(), -1);
  std::vector<uint8_t> taken;  // per (peer, direction)
  int ops = 0;
  bool fits = true;
  for (size_t i = 0; i < items.size(); ++i) {
    const P2PBatchItem& it = items[i];
    plan.geometry.push_back(plan_p2p(it.bytes, p2p_slot_bytes, p2p_channels, sms, max_blocks));
    const size_t key = 2 * size_t(std::max(0, it.peer)) + (it.is_send ? 1 : 0);
    if (taken.size() <= key) taken.resize(key + 1, 0);
    if (taken[key]) fits = false;
    taken[key] = 1;
    plan.first_block[i] = plan.grid;
    plan.grid += plan.geometry.back().blocks;
    ++ops;
  }
  plan.fits = fits && ops > 0 && ops <= max_ops && plan.grid <= std::max(1, sms - kSmHeadroom);
  return plan;
}

int all_to_all_channels(int nranks, int coll_channels, int sms) {
  const int channels = std::min({kAllToAllChannels, coll_channels, std::max(1, (sms - kSmHeadroom) / 2)});
  return std::min(coll_channels, std::max(channels, nranks - 1));
}

Geometry plan_split(int64_t elems, int64_t elem_bytes, int64_t chunk_bytes, int max_channels) {
  Geometry g;
  const int64_t pack = std::max<int64_t>(1, 16 / elem_bytes);
  g.chunk = std::max<int64_t>(2 * pack, chunk_bytes / elem_bytes / (2 * pack) * (2 * pack));
  if (elems <= 0) {
    g.blocks = 1;
    g.seg = 0;
    return g;
  }
  const int64_t by_size = std::max<int64_t>(1, ceil_div(elems * elem_bytes, kCost.min_chunk_bytes));
  const int64_t channels = std::max<int64_t>(1, std::min<int64_t>(max_channels, by_size));
  g.seg = round_up(ceil_div(elems, channels), pack);
  g.blocks = int(ceil_div(elems, g.seg));
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
        case Algo::OneShot:  // one hop; (n-1)N out; every rank reduces all n copies
          return L + h + (n - 1) * N / link + (n + 1) * N / hbm;
        case Algo::TwoShot:  // two hops; 2(n-1)/n N out; reduce 1/n, copy the rest
          return L + 2 * h + 2 * (n - 1) / n * N / link + 2 * N / hbm;
        case Algo::Ring:  // 2(n-1) hops per chunk
          return L + 2 * (n - 1) * h + 2 * (n - 1) / n * N / link + 2 * N / hbm;
        case Algo::Tree:  // up and down the depth of the tree; ~N out per rank
          return L + 2 * ceil_log2(nranks) * h + N / link + 2 * N / hbm;
        case Algo::Auto:
        case Algo::Direct:
        case Algo::Hierarchical:
        case Algo::Flat:
        case Algo::Schedule: break;
      }
      break;
    case OpCode::ReduceScatter:
    case OpCode::AllGather:
      // `bytes` is one rank's share: (n-1) shares leave each rank either way.
      if (algo == Algo::Ring) return L + (n - 1) * h + (n - 1) * N / link + 2 * n * N / hbm;
      return L + h + (n - 1) * N / link + 2 * n * N / hbm;
    default: break;
  }
  return std::numeric_limits<double>::infinity();
}

// With more than two ranks the ring beats the direct algorithms for large messages, which the
// alpha-beta model above, fitted on two GPUs, does not predict: reading from every peer at once
// reaches less of the link than one neighbour at a time. Until the model is calibrated on more
// GPUs, these measured crossovers rule.
// docs/decisions/0003-ring-crossovers-beyond-two-ranks.md
constexpr int64_t kManyRanksRingAllReduceBytes = int64_t(16) << 20;
constexpr int64_t kManyRanksRingReduceScatterBytesPerRank = int64_t(2) << 20;
constexpr int64_t kManyRanksRingAllGatherBytesPerRank = int64_t(8) << 20;

namespace {

// Three and four ranks: measured (select.h, kFewRanks*).
bool few_ranks(int nranks) { return nranks == 3 || nranks == 4; }

Algo builtin_all_reduce(int64_t bytes, int nranks) {
  if (few_ranks(nranks)) {
    if (bytes > kFewRanksRingAllReduceBytes) return Algo::Ring;
    if (bytes >= kFewRanksTwoShotAllReduceBytes) return Algo::TwoShot;
  }
  if (nranks > 4 && bytes >= kManyRanksRingAllReduceBytes) return Algo::Ring;
  if (nranks == 2 && bytes >= kTwoRankSplitAllReduceBytes) return Algo::OneShot;  // runs split (select.h)
  if (nranks == 2 && bytes >= kTwoRankTwoShotAllReduceBytes) return Algo::TwoShot;
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

Algo builtin_reduce_scatter(int64_t bytes_per_rank, int nranks) {
  if (nranks > 2 && bytes_per_rank >= kManyRanksRingReduceScatterBytesPerRank) return Algo::Ring;
  // Direct moves the same bytes as the ring in one hop instead of n-1 on an NVSwitch/NVLink
  // clique, so it wins at every size in this model.
  return predict_us(OpCode::ReduceScatter, Algo::Ring, bytes_per_rank, nranks) <
                 predict_us(OpCode::ReduceScatter, Algo::OneShot, bytes_per_rank, nranks)
             ? Algo::Ring
             : Algo::OneShot;
}

Algo builtin_all_gather(int64_t bytes_per_rank, int nranks) {
  if (nranks > 2 && bytes_per_rank >= kManyRanksRingAllGatherBytesPerRank) return Algo::Ring;
  return predict_us(OpCode::AllGather, Algo::Ring, bytes_per_rank, nranks) <
                 predict_us(OpCode::AllGather, Algo::OneShot, bytes_per_rank, nranks)
             ? Algo::Ring
             : Algo::OneShot;
}

}  // namespace

bool wide_two_shot(int64_t bytes, int nranks, bool waves, int wide_blocks) {
  return nranks == 2 && waves && wide_blocks > 0 && bytes <= kTwoRankWideTwoShotMaxBytes;
}

int two_shot_max_blocks(int64_t bytes, int nranks, bool waves, int max_blocks, int wide_blocks) {
  return wide_two_shot(bytes, nranks, waves, wide_blocks) ? wide_blocks : max_blocks;
}

int64_t two_shot_chunk_bytes(int64_t bytes, int64_t seg_bytes, int nranks, bool waves, int wide_blocks,
                             int64_t chunk_bytes, bool chunk_set) {
  if (!wide_two_shot(bytes, nranks, waves, wide_blocks) || chunk_set) return chunk_bytes;
  // Equal chunks per CTA: a CTA's share cut into k pieces of at most the cap (a plain cap would
  // give some CTAs one short chunk more than others wherever the share is not k whole caps).
  const int64_t share = ceil_div(seg_bytes, wide_blocks);
  const int64_t k = ceil_div(share, kTwoRankWideTwoShotChunkBytes);
  if (k <= 1) return chunk_bytes;  // one chunk per CTA: plan_geometry's own cut
  return std::min(chunk_bytes, round_up(ceil_div(share, k), 16));
}

Algo builtin_choice(OpCode op, int64_t bytes, int nranks) {
  switch (op) {
    case OpCode::AllReduce: return builtin_all_reduce(bytes, nranks);
    case OpCode::ReduceScatter: return builtin_reduce_scatter(bytes, nranks);
    case OpCode::AllGather: return builtin_all_gather(bytes, nranks);
    default: return Algo::Auto;
  }
}

// This machine's calibration first (measured_choices.h), where it covers the call.
Algo choose(OpCode op, int64_t bytes, int nranks) {
  if (auto m = measured_choice(op, bytes, nranks)) return *m;
  return builtin_choice(op, bytes, nranks);
}

Algo choose_all_reduce(int64_t bytes, int nranks, int64_t fast_two_shot_max_bytes) {
  const Algo a = choose(OpCode::AllReduce, bytes, nranks);
  if (a == Algo::TwoShot && nranks == 2 && bytes > fast_two_shot_max_bytes &&
      bytes < kTwoRankChannelTwoShotAllReduceBytes)
    return Algo::OneShot;
  return a;
}

}  // namespace gpu
}  // namespace pycoll

#include "cpu/pipelined.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

#include "common/check.h"
#include "common/setting.h"
#include "cpu/kernels/stream_store.h"

namespace pycoll {

namespace {

// Each lane's slots take about 1 MiB per rank, in sub-slots of 16-256 KiB: small enough to stay
// in the shared cache, large enough that the per-step waits are few.
// docs/decisions/0026-cpu-pipeline-lanes-slots-and-steps.md
constexpr size_t kRingBytes = 1 << 20;
constexpr size_t kMinSubBytes = 16 << 10;
constexpr size_t kMaxSubBytes = 256 << 10;
// Slots per lane: a rank may run this many steps ahead of its slowest peer.
constexpr int kSlots = 4;

// The least message a lane is worth, by ranks: over 2 ranks small lanes let a 1-4 MiB op use more
// threads; over more ranks every rank's lanes spin at once, and a descheduled lane stalls them all.
// Below PYCOLL_CPU_LANES_MIN_OP_BYTES an op keeps one lane.
// docs/decisions/0026-cpu-pipeline-lanes-slots-and-steps.md
const IntSetting kLanesMinOpBytes("PYCOLL_CPU_LANES_MIN_OP_BYTES", 256 << 10, 0, int64_t(1) << 40, "cpu engine", true,
                                  Audience::Developer,
                                  "The least op size (bytes) that a pipelined CPU op splits into several lanes (threads); "
                                  "smaller ops run one lane.",
                                  "256K", /*bytes=*/true);
size_t lanes_min_op_bytes() {
  static const size_t bytes = static_cast<size_t>(kLanesMinOpBytes.get());  // read once: it is on every op's path
  return bytes;
}
size_t min_lane_bytes(int ranks) { return ranks <= 2 ? size_t(128) << 10 : size_t(512) << 10; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One lane's view of the data regions and its counters.
class LaneRing {
 public:
  LaneRing(Pipeline& p, int lane, int subs, size_t elem_bytes)
      : t_(p.t), w_(p.w), lane_(lane), n_(p.t.size()), me_(p.t.rank()) {
    lane_bytes_ = (t_.data_bytes() / static_cast<size_t>(p.lanes)) & ~size_t(63);
    const size_t per_sub = kSlots * static_cast<size_t>(subs);
    const size_t wanted = std::clamp(kRingBytes / per_sub, kMinSubBytes, kMaxSubBytes);
    sub_bytes_ = std::min(wanted, lane_bytes_ / per_sub) & ~size_t(63);
    if (sub_bytes_ < elem_bytes) {
      throw std::invalid_argument(str("pycoll: the CPU data region (PYCOLL_SHM_BYTES=", t_.data_bytes(),
                                      ") is too small for a pipelined op over ", n_, " ranks"));
    }
    slot_bytes_ = sub_bytes_ * static_cast<size_t>(subs);
    chunk_ = static_cast<int64_t>(sub_bytes_ / elem_bytes);
  }

  int64_t chunk() const { return chunk_; }
  // Rank r's sub-slot k for step g.
  char* sub(int r, uint64_t g, int k) const {
    return t_.data(r) + lane_ * lane_bytes_ + (g % kSlots) * slot_bytes_ + static_cast<size_t>(k) * sub_bytes_;
  }
  void publish(Counter LaneCounters::* which, uint64_t value) {
    (t_.control(me_).lanes[lane_].*which).value.store(value, std::memory_order_release);
  }
  void wait_peer(int r, Counter LaneCounters::* which, uint64_t value, const char* stage) {
    w_.until_ge(r, (t_.control(r).lanes[lane_].*which).value, value, stage);
  }
  void wait_peers(Counter LaneCounters::* which, uint64_t value, const char* stage) {
    for (int r = 0; r < n_; ++r) {
      if (r != me_) wait_peer(r, which, value, stage);
    }
  }
  // Before I overwrite my slot for step g, every peer has read it for step g - kSlots.
  void wait_slot_free(uint64_t g) {
    if (g >= kSlots) wait_peers(&LaneCounters::consumed, g - kSlots + 1, "pipeline slot free");
  }

 private:
  Transport& t_;
  Waiter& w_;
  int lane_, n_, me_;
  size_t lane_bytes_ = 0, sub_bytes_ = 0, slot_bytes_ = 0;
  int64_t chunk_ = 0;
};

// Lane `lane`'s part [begin, begin + len) of the range [0, count) split among `lanes`.
struct Span {
  int64_t begin, len;
};
Span lane_span(int64_t range_begin, int64_t count, int lanes, int lane) {
  const int64_t b = part_begin(count, lanes, lane);
  return {range_begin + b, part_end(count, lanes, lane) - b};
}

// Runs step(g, at, len) for each chunk of `span` in order (g: the lane's step number, [at, at + len):
// the chunk), then advances the lane's step counter. Returns the step after the last.
template <typename Step>
uint64_t for_each_step(Pipeline& p, int lane, const Span& span, int64_t chunk, Step&& step) {
  const int64_t steps = ceil_div(span.len, chunk);
  const uint64_t g0 = p.lane_step[lane];
  for (int64_t k = 0; k < steps; ++k) step(g0 + k, span.begin + k * chunk, std::min(chunk, span.len - k * chunk));
  p.lane_step[lane] = g0 + steps;
  return g0 + steps;
}

}  // namespace

void run_lanes(Pipeline& p, const std::function<void(int)>& lane) {
  if (p.lanes <= 1 || p.pool == nullptr) {
    lane(0);
  } else {
    p.pool->run(p.lanes, lane);
  }
}

int pipeline_lanes(size_t bytes, int ranks, int threads) {
  if (bytes < lanes_min_op_bytes()) return 1;
  return static_cast<int>(
      std::clamp<size_t>(bytes / min_lane_bytes(ranks), 1, static_cast<size_t>(std::max(1, threads))));
}

void pipelined_all_reduce(Pipeline& p, const ReduceSpec& spec, const char* in, char* out, int64_t count) {
  const size_t E = dtype_size(spec.dtype);
  const int n = p.t.size(), me = p.t.rank();
  run_lanes(p, [&](int lane) {
    LaneRing ring(p, lane, n + 1, E);  // sub-slot q: my input for rank q; sub-slot n: what I reduced
    const int64_t chunk = ring.chunk();
    std::vector<Span> span(n);
    int64_t steps = 0;
    for (int r = 0; r < n; ++r) {
      const int64_t b = part_begin(count, n, r);
      span[r] = lane_span(b, part_end(count, n, r) - b, p.lanes, lane);
      steps = std::max(steps, ceil_div(span[r].len, chunk));
    }
    std::vector<Operand> srcs(n);
    const uint64_t g0 = p.lane_step[lane];
    for (int64_t k = 0; k < steps; ++k) {
      const uint64_t g = g0 + k;
      const int64_t off = k * chunk;
      auto piece = [&](int r) { return std::clamp<int64_t>(span[r].len - off, 0, chunk); };
      ring.wait_slot_free(g);
      for (int q = 0; q < n; ++q) {
        if (q != me && piece(q) > 0) std::memcpy(ring.sub(me, g, q), in + (span[q].begin + off) * E, piece(q) * E);
      }
      ring.publish(&LaneCounters::staged, g + 1);
      ring.wait_peers(&LaneCounters::staged, g + 1, "pipeline: peers' inputs");
      if (const int64_t len = piece(me); len > 0) {
        // Into my slot first (the peers read it from there), then once into the output.
        for (int r = 0; r < n; ++r) srcs[r] = {r == me ? in + (span[me].begin + off) * E : ring.sub(r, g, me), false};
        reduce_operands(spec, ring.sub(me, g, n), false, srcs.data(), n, len, true);
        std::memcpy(out + (span[me].begin + off) * E, ring.sub(me, g, n), len * E);
      }
      ring.publish(&LaneCounters::reduced, g + 1);
      for (int q = 0; q < n; ++q) {
        if (q == me) continue;
        ring.wait_peer(q, &LaneCounters::reduced, g + 1, "pipeline: peers' reduced chunks");
        if (piece(q) > 0) std::memcpy(out + (span[q].begin + off) * E, ring.sub(q, g, n), piece(q) * E);
      }
      ring.publish(&LaneCounters::consumed, g + 1);
    }
    p.lane_step[lane] = g0 + steps;
    if (steps > 0) ring.wait_peers(&LaneCounters::consumed, g0 + steps, "pipeline: peers finishing");
  });
}

void pipelined_reduce_scatter(Pipeline& p, const ReduceSpec& spec, const char* in, char* out, int64_t m) {
  const size_t E = dtype_size(spec.dtype);
  const int n = p.t.size(), me = p.t.rank();
  run_lanes(p, [&](int lane) {
    LaneRing ring(p, lane, n, E);  // sub-slot q: my block q for rank q
    std::vector<Operand> srcs(n);
    const uint64_t g0 = p.lane_step[lane];
    const uint64_t end =
        for_each_step(p, lane, lane_span(0, m, p.lanes, lane), ring.chunk(), [&](uint64_t g, int64_t at, int64_t len) {
          ring.wait_slot_free(g);
          for (int q = 0; q < n; ++q) {
            if (q != me) std::memcpy(ring.sub(me, g, q), in + (q * m + at) * E, len * E);
          }
          ring.publish(&LaneCounters::staged, g + 1);
          ring.wait_peers(&LaneCounters::staged, g + 1, "pipeline: peers' inputs");
          for (int r = 0; r < n; ++r) srcs[r] = {r == me ? in + (me * m + at) * E : ring.sub(r, g, me), false};
          reduce_operands(spec, out + at * E, false, srcs.data(), n, len, true);
          ring.publish(&LaneCounters::consumed, g + 1);
        });
    if (end > g0) ring.wait_peers(&LaneCounters::consumed, end, "pipeline: peers finishing");
  });
}

void pipelined_all_gather(Pipeline& p, DType t, const char* in, char* out, int64_t m) {
  const size_t E = dtype_size(t);
  const int n = p.t.size(), me = p.t.rank();
  const bool in_place = in == out + me * m * E;
  run_lanes(p, [&](int lane) {
    LaneRing ring(p, lane, 1, E);
    const uint64_t g0 = p.lane_step[lane];
    const uint64_t end =
        for_each_step(p, lane, lane_span(0, m, p.lanes, lane), ring.chunk(), [&](uint64_t g, int64_t at, int64_t len) {
          ring.wait_slot_free(g);
          std::memcpy(ring.sub(me, g, 0), in + at * E, len * E);
          ring.publish(&LaneCounters::staged, g + 1);
          // My own block from my input, not from the slot: the peers read the slot at the same moment,
          // and sharing its lines with them costs more (docs/decisions/0026-cpu-pipeline-lanes-slots-and-steps.md).
          if (!in_place) copy_to_output(p.stream_out, out + (me * m + at) * E, in + at * E, len * E);
          for (int q = 0; q < n; ++q) {
            if (q == me) continue;
            ring.wait_peer(q, &LaneCounters::staged, g + 1, "pipeline: peers' blocks");
            copy_to_output(p.stream_out, out + (q * m + at) * E, ring.sub(q, g, 0), len * E);
          }
          ring.publish(&LaneCounters::consumed, g + 1);
        });
    if (end > g0) ring.wait_peers(&LaneCounters::consumed, end, "pipeline: peers finishing");
  });
}

void pipelined_broadcast(Pipeline& p, DType t, char* buf, int64_t count, int root) {
  const size_t E = dtype_size(t);
  const int me = p.t.rank();
  run_lanes(p, [&](int lane) {
    LaneRing ring(p, lane, 1, E);
    const uint64_t g0 = p.lane_step[lane];
    const uint64_t end = for_each_step(
        p, lane, lane_span(0, count, p.lanes, lane), ring.chunk(), [&](uint64_t g, int64_t at, int64_t len) {
          if (me == root) {
            ring.wait_slot_free(g);
            std::memcpy(ring.sub(me, g, 0), buf + at * E, len * E);
            ring.publish(&LaneCounters::staged, g + 1);
            ring.publish(&LaneCounters::consumed, g + 1);  // the root reads nothing; later steps wait on this
          } else {
            ring.wait_peer(root, &LaneCounters::staged, g + 1, "pipeline: root's data");
            std::memcpy(buf + at * E, ring.sub(root, g, 0), len * E);
            ring.publish(&LaneCounters::consumed, g + 1);
          }
        });
    if (me == root && end > g0) ring.wait_peers(&LaneCounters::consumed, end, "pipeline: peers finishing");
  });
}

}  // namespace pycoll

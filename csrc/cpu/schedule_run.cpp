#include "cpu/schedule_run.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/check.h"

namespace pycoll {

namespace {

// A slot holds at most this much: larger messages run in more segments. Messages of 8 MiB (a
// 16 MiB region over one channel of depth 2) made a 64 MiB all_reduce over 2 ranks 1.2x slower
// than the built-in ring, whose messages are 4 MiB: each step's data then no longer stays in cache.
constexpr size_t kSlotMaxBytes = size_t(4) << 20;

// Where the chunks of one segment lie: block b's segment is elements [b * block + off, + len).
struct Segment {
  int64_t block, off, len;
  int64_t s;  // a chunk's length: ceil(len / chunks)
  int chunks;
  // Chunk `c` of buffer `b`: its first element and its length (scratch chunks are s long).
  void chunk(ScheduleBuffer b, int64_t c, int64_t& at, int64_t& n) const {
    if (b == ScheduleBuffer::Scratch) {
      at = c * s;
      n = s;
      return;
    }
    const int64_t blk = c / chunks, j = c % chunks;
    const int64_t lo = std::min(j * s, len), hi = std::min((j + 1) * s, len);
    at = blk * block + off + lo;
    n = hi - lo;
  }
};

// Spans (destination, source, second source or nullptr) of `count` elements, merged while all of
// them continue the last.
template <typename F>
class Spans {
 public:
  Spans(size_t elem, F f) : elem_(elem), f_(std::move(f)) {}
  void add(char* dst, const char* src, int64_t n, const char* src2 = nullptr) {
    if (n <= 0) return;
    const size_t run = size_t(n_) * elem_;
    if (n_ > 0 && dst == dst_ + run && src == src_ + run && (src2 == nullptr) == (src2_ == nullptr) &&
        (src2 == nullptr || src2 == src2_ + run)) {
      n_ += n;
      return;
    }
    flush();
    dst_ = dst;
    src_ = src;
    src2_ = src2;
    n_ = n;
  }
  void flush() {
    if (n_ > 0) f_(dst_, src_, src2_, n_);
    n_ = 0;
  }

 private:
  size_t elem_;
  F f_;
  char* dst_ = nullptr;
  const char* src_ = nullptr;
  const char* src2_ = nullptr;
  int64_t n_ = 0;
};

class Executor {
 public:
  Executor(CpuContext& c, const ScheduleRun& r, uint64_t base)
      : c_(c), r_(r), p_(*r.program), mine_(p_.rank[r.me]), base_(base), elem_(dtype_size(r.spec.dtype)) {
    n_ = p_.ranks;
    depth_ = std::max(1, p_.channel_depth);
    me_ = group_rank(r.me);
    if (p_.slot_channels > 0) {
      slot_bytes_ = std::min(kSlotMaxBytes, (c.t.data_bytes() / (size_t(p_.slot_channels) * depth_)) & ~size_t(63));
    }
    // The longest segment whose largest message fits one slot.
    int64_t seg = r.block;
    if (p_.max_message_chunks > 0) {
      const int64_t s_max = static_cast<int64_t>(slot_bytes_ / (size_t(p_.max_message_chunks) * elem_));
      if (s_max < 1) {
        throw std::invalid_argument(str("pycoll: schedule program '", p_.name, "' sends messages of ",
                                        p_.max_message_chunks, " chunks through ", p_.slot_channels * depth_,
                                        " slots of ", slot_bytes_, " bytes: raise PYCOLL_SHM_BYTES"));
      }
      seg = std::min<int64_t>(r.block, s_max * p_.chunks);
    }
    segments_ = r.block > 0 ? (r.block + seg - 1) / seg : 0;
    const int64_t longest = segments_ > 0 ? (r.block + segments_ - 1) / segments_ : 0;
    const int64_t s = (longest + p_.chunks - 1) / p_.chunks;
    if (p_.scratch > 0) {
      const size_t need = size_t(p_.scratch) * size_t(s) * elem_;
      if (r.scratch->size() < need) r.scratch->resize(need);
      scratch_ = r.scratch->data();
    }
    for (int l = 0; l < kMaxLanes; ++l) done_[l].value.store(0, std::memory_order_relaxed);
    arrived_.value.store(0, std::memory_order_relaxed);
  }

  int lanes() const { return std::max(1, p_.lanes); }
  int64_t segments() const { return segments_; }

  void run_lane(int lane) {
    if (lane >= static_cast<int>(mine_.lanes.size())) {
      meet_all_segments(lane);
      return;
    }
    const std::vector<ScheduleStep>& steps = mine_.lanes[lane];
    const uint64_t len = steps.size();
    for (int64_t k = 0; k < segments_; ++k) {
      if (k > 0) meet(k);
      const Segment g = segment(k);
      for (size_t i = 0; i < steps.size(); ++i) {
        const ScheduleStep& st = steps[i];
        for (int32_t d = st.deps_begin; d < st.deps_end; ++d) {
          const ScheduleDep& dep = mine_.deps[d];
          const uint64_t target = uint64_t(k) * mine_.lanes[dep.lane].size() + dep.index + 1;
          c_.w.until_ge(me_, done_[dep.lane].value, target, "schedule: a step of another lane");
        }
        run_step(st, g, k);
        done_[lane].value.store(uint64_t(k) * len + i + 1, std::memory_order_release);
      }
    }
  }

 private:
  int group_rank(int v) const { return (v + r_.rank_shift) % n_; }
  char* slot(int rank, int channel, int64_t m) const {
    return c_.t.data(rank) + (size_t(channel) * depth_ + size_t(m % depth_)) * slot_bytes_;
  }
  char* buffer(ScheduleBuffer b) const {
    return b == ScheduleBuffer::In ? r_.in : b == ScheduleBuffer::Out ? r_.out : scratch_;
  }
  Segment segment(int64_t k) const {
    const int64_t off = part_begin(r_.block, static_cast<int>(segments_), static_cast<int>(k));
    const int64_t len = part_end(r_.block, static_cast<int>(segments_), static_cast<int>(k)) - off;
    return Segment{r_.block, off, len, (len + p_.chunks - 1) / p_.chunks, p_.chunks};
  }
  // Lanes meet between segments only where they share scratch.
  bool lanes_meet() const { return p_.scratch > 0 && lanes() > 1; }
  void meet(int64_t k) {
    if (!lanes_meet()) return;
    arrived_.value.fetch_add(1, std::memory_order_acq_rel);
    c_.w.until_ge(me_, arrived_.value, uint64_t(k) * lanes(), "schedule: the other lanes at a segment's end");
  }
  void meet_all_segments(int /*lane*/) {
    for (int64_t k = 1; k < segments_; ++k) meet(k);
  }

  void copy_spans(char* dst, const char* src, int64_t n) const { std::memcpy(dst, src, size_t(n) * elem_); }
  // dst = a op b (dst may be a).
  void reduce_spans(char* dst, const char* a, const char* b, int64_t n) const {
    const Operand srcs[2] = {{a, false}, {b, false}};
    reduce_operands(r_.spec, dst, false, srcs, 2, n, false);
  }

  void run_step(const ScheduleStep& st, const Segment& g, int64_t k) {
    const size_t chunk_bytes = size_t(g.s) * elem_;
    int64_t at = 0, n = 0, src_at = 0, src_n = 0;
    switch (st.op) {
      case ScheduleOp::Send: {
        const int peer = group_rank(st.peer);
        const int64_t m = k * st.channel_messages + st.seq;
        if (m >= depth_) {
          c_.w.until_ge(peer, c_.t.control(peer).schedule_taken[st.peer_channel].value, base_ + m - depth_ + 1,
                        "schedule: a free slot to send into");
        }
        char* to = slot(me_, st.channel, m);
        char* from = buffer(st.src.buffer);
        Spans spans(elem_, [this](char* d, const char* s, const char*, int64_t c) { copy_spans(d, s, c); });
        for (int32_t i = 0; i < st.src.count; ++i) {
          g.chunk(st.src.buffer, st.src.first + i, at, n);
          spans.add(to + i * chunk_bytes, from + at * elem_, n);
        }
        spans.flush();
        c_.t.control(me_).schedule_sent[st.channel].value.store(base_ + m + 1, std::memory_order_release);
        return;
      }
      case ScheduleOp::Recv:
      case ScheduleOp::RecvReduce: {
        const int peer = group_rank(st.peer);
        const int64_t m = k * st.channel_messages + st.seq;
        c_.w.until_ge(peer, c_.t.control(peer).schedule_sent[st.peer_channel].value, base_ + m + 1,
                      "schedule: a message to receive");
        const char* from = slot(peer, st.peer_channel, m);
        char* to = buffer(st.dst.buffer);
        const auto take = [&](auto&& f) {
          Spans spans(elem_, f);
          for (int32_t i = 0; i < st.dst.count; ++i) {
            g.chunk(st.dst.buffer, st.dst.first + i, at, n);
            g.chunk(st.src.buffer, st.src.first + i, src_at, src_n);
            spans.add(to + at * elem_, from + i * chunk_bytes, std::min(n, src_n));
          }
          spans.flush();
        };
        if (st.op == ScheduleOp::Recv) {
          take([this](char* d, const char* s, const char*, int64_t c) { copy_spans(d, s, c); });
        } else {
          take([this](char* d, const char* s, const char*, int64_t c) { reduce_spans(d, d, s, c); });
        }
        c_.t.control(me_).schedule_taken[st.channel].value.store(base_ + m + 1, std::memory_order_release);
        return;
      }
      case ScheduleOp::Copy:
      case ScheduleOp::Reduce: {
        char* to = buffer(st.dst.buffer);
        const char* from = buffer(st.src.buffer);
        const auto move = [&](auto&& f) {
          Spans spans(elem_, f);
          for (int32_t i = 0; i < std::min(st.dst.count, st.src.count); ++i) {
            g.chunk(st.dst.buffer, st.dst.first + i, at, n);
            g.chunk(st.src.buffer, st.src.first + i, src_at, src_n);
            spans.add(to + at * elem_, from + src_at * elem_, std::min(n, src_n));
          }
          spans.flush();
        };
        if (st.op == ScheduleOp::Copy) {
          move([this](char* d, const char* s, const char*, int64_t c) { std::memmove(d, s, size_t(c) * elem_); });
        } else {
          move([this](char* d, const char* s, const char*, int64_t c) { reduce_spans(d, d, s, c); });
        }
        return;
      }
      case ScheduleOp::RecvReduceSend: {
        // The message from `peer` reduced with R, straight into the slot of the send to `to_peer`;
        // R's elements beyond what the message holds go as they are.
        const int peer = group_rank(st.peer), to_peer = group_rank(st.to_peer);
        const int64_t m = k * st.channel_messages + st.seq;
        const int64_t m2 = k * st.to_channel_messages + st.to_seq;
        c_.w.until_ge(peer, c_.t.control(peer).schedule_sent[st.peer_channel].value, base_ + m + 1,
                      "schedule: a message to receive");
        if (m2 >= depth_) {
          c_.w.until_ge(to_peer, c_.t.control(to_peer).schedule_taken[st.to_peer_channel].value,
                        base_ + m2 - depth_ + 1, "schedule: a free slot to send into");
        }
        const char* from = slot(peer, st.peer_channel, m);
        char* to = slot(me_, st.to_channel, m2);
        const char* mine = buffer(st.dst.buffer);
        Spans reduce(elem_, [this](char* d, const char* a, const char* b, int64_t c) { reduce_spans(d, a, b, c); });
        Spans copy(elem_, [this](char* d, const char* s, const char*, int64_t c) { copy_spans(d, s, c); });
        for (int32_t i = 0; i < st.dst.count; ++i) {
          g.chunk(st.dst.buffer, st.dst.first + i, at, n);
          g.chunk(st.src.buffer, st.src.first + i, src_at, src_n);
          const int64_t both = std::min(n, src_n);
          char* out = to + i * chunk_bytes;
          reduce.add(out, mine + at * elem_, both, from + i * chunk_bytes);
          copy.add(out + both * elem_, mine + (at + both) * elem_, n - both);
        }
        reduce.flush();
        copy.flush();
        c_.t.control(me_).schedule_taken[st.channel].value.store(base_ + m + 1, std::memory_order_release);
        c_.t.control(me_).schedule_sent[st.to_channel].value.store(base_ + m2 + 1, std::memory_order_release);
        return;
      }
      case ScheduleOp::FusedAway: return;
    }
  }

  CpuContext& c_;
  const ScheduleRun& r_;
  const ScheduleProgram& p_;
  const RankSchedule& mine_;
  const uint64_t base_;
  const size_t elem_;
  int n_ = 1, depth_ = 1, me_ = 0;
  size_t slot_bytes_ = 0;
  int64_t segments_ = 0;
  char* scratch_ = nullptr;
  Counter done_[kMaxLanes];  // steps each lane finished, counted across segments
  Counter arrived_;          // lanes that reached a segment's end
};

}  // namespace

void execute_schedule(CpuContext& c, const ScheduleRun& run, uint64_t& step) {
  Executor x(c, run, step);
  const int lanes = x.lanes();
  if (lanes > 1) {
    if (run.pool == nullptr || run.pool->workers() + 1 < lanes) {
      throw std::logic_error("pycoll: a schedule program's lanes were given too few threads");
    }
    run.pool->run(lanes, [&x](int lane) { x.run_lane(lane); });
  } else {
    x.run_lane(0);
  }
  step += static_cast<uint64_t>(x.segments()) * static_cast<uint64_t>(run.program->max_channel_messages);
}

}  // namespace pycoll

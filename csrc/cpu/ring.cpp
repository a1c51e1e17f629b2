#include "cpu/ring.h"

#include <cstring>

namespace pycoll {

namespace {

struct Ring {
  CpuContext& c;
  int n, me, left, right;
  size_t slot_bytes;
  explicit Ring(CpuContext& ctx)
      : c(ctx),
        n(ctx.size()),
        me(ctx.rank()),
        left((ctx.rank() - 1 + ctx.size()) % ctx.size()),
        right((ctx.rank() + 1) % ctx.size()),
        slot_bytes((ctx.half_bytes() / 2) & ~size_t(63)) {}
  char* slot(int r, uint64_t g) const { return c.half(r) + (g & 1) * slot_bytes; }
  int mod(int x) const { return ((x % n) + n) % n; }
  // Before writing my slot for step g, the right neighbour must have read step g-2.
  void wait_slot_free(uint64_t g) {
    if (g > 2) c.w.until_ge(right, c.t.control(right).ring_consumed.value, g - 2, "ring slot free");
  }
  void publish(uint64_t g) { c.t.control(me).ring_ready.value.store(g, std::memory_order_release); }
  void consumed(uint64_t g) { c.t.control(me).ring_consumed.value.store(g, std::memory_order_release); }
  void wait_left(uint64_t g) { c.w.until_ge(left, c.t.control(left).ring_ready.value, g, "ring data from left"); }

  void reduce_scatter_pass(const ReduceSpec& spec, const RingSegments& s) {
    const uint64_t base = c.ring_step;
    uint64_t g = base + 1;
    wait_slot_free(g);
    const int j0 = mod(me - 1);
    convert_elements(spec.dtype, slot(me, g), true, s.in[j0], false, s.len[j0]);
    publish(g);
    for (int st = 0; st <= n - 2; ++st) {
      g = base + 1 + st;
      wait_left(g);
      const int j = mod(me - 2 - st);
      Operand srcs[2] = {{slot(left, g), true}, {s.in[j], false}};
      if (st == n - 2) {
        reduce_operands(spec, s.out[j], false, srcs, 2, s.len[j], true);  // j == me: finished
        consumed(g);
      } else {
        wait_slot_free(g + 1);
        reduce_operands(spec, slot(me, g + 1), true, srcs, 2, s.len[j], false);
        consumed(g);
        publish(g + 1);
      }
    }
    c.ring_step = base + n - 1;
  }

  void all_gather_pass(size_t E, const char* own, const RingSegments& s) {
    const uint64_t base = c.ring_step;
    uint64_t g = base + 1;
    wait_slot_free(g);
    std::memcpy(slot(me, g), own, s.len[me] * E);
    publish(g);
    for (int st = 0; st <= n - 2; ++st) {
      g = base + 1 + st;
      wait_left(g);
      const int j = mod(me - 1 - st);
      std::memcpy(s.out[j], slot(left, g), s.len[j] * E);
      if (st < n - 2) {
        wait_slot_free(g + 1);
        std::memcpy(slot(me, g + 1), slot(left, g), s.len[j] * E);
      }
      consumed(g);
      if (st < n - 2) publish(g + 1);
    }
    c.ring_step = base + n - 1;
  }
};

}  // namespace

void ring_all_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count) {
  Ring ring(c);
  const int n = ring.n;
  const size_t E = dtype_size(spec.dtype);
  const int64_t seg_cap = static_cast<int64_t>(ring.slot_bytes / acc_size(spec.dtype));
  const int64_t chunk = seg_cap * n;
  RingSegments s{std::vector<const char*>(n), std::vector<char*>(n), std::vector<int64_t>(n)};
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t len = std::min(chunk, count - off);
    for (int j = 0; j < n; ++j) {
      const int64_t a = part_begin(len, n, j), b = part_end(len, n, j);
      s.in[j] = in + (off + a) * E;
      s.out[j] = out + (off + a) * E;
      s.len[j] = b - a;
    }
    // In place is safe: segment j of `out` is written only after the last
    // read of segment j of `in` on this rank (final step, then all-gather).
    ring.reduce_scatter_pass(spec, s);
    ring.all_gather_pass(E, s.out[ring.me], s);
  }
  ++c.phase;
  c.barrier();
}

void ring_reduce_scatter(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t m) {
  Ring ring(c);
  const int n = ring.n;
  const size_t E = dtype_size(spec.dtype);
  const int64_t chunk = static_cast<int64_t>(ring.slot_bytes / acc_size(spec.dtype));
  RingSegments s{std::vector<const char*>(n), std::vector<char*>(n, nullptr), std::vector<int64_t>(n)};
  for (int64_t off = 0; off < m; off += chunk) {
    const int64_t len = std::min(chunk, m - off);
    for (int j = 0; j < n; ++j) {
      s.in[j] = in + (j * m + off) * E;
      s.len[j] = len;
    }
    s.out[ring.me] = out + off * E;
    ring.reduce_scatter_pass(spec, s);
  }
  ++c.phase;
  c.barrier();
}

void ring_all_gather(CpuContext& c, DType t, const char* in, char* out, int64_t m) {
  Ring ring(c);
  const int n = ring.n;
  const size_t E = dtype_size(t);
  const int64_t chunk = static_cast<int64_t>(ring.slot_bytes / E);
  RingSegments s{std::vector<const char*>(n), std::vector<char*>(n), std::vector<int64_t>(n)};
  for (int64_t off = 0; off < m; off += chunk) {
    const int64_t len = std::min(chunk, m - off);
    for (int j = 0; j < n; ++j) {
      s.out[j] = out + (j * m + off) * E;
      s.len[j] = len;
    }
    std::memcpy(s.out[ring.me], in + off * E, len * E);
    ring.all_gather_pass(E, s.out[ring.me], s);
  }
  ++c.phase;
  c.barrier();
}

}  // namespace pycoll

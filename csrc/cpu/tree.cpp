#include "cpu/tree.h"

#include <cstring>
#include <vector>

#include "common/setting.h"

namespace pycoll {

namespace {

struct Tree {
  CpuContext& c;
  int n, me, root, v, parent;
  std::vector<int> children;
  size_t slot_bytes;
  Tree(CpuContext& ctx, int root_rank) : c(ctx), n(ctx.size()), me(ctx.rank()), root(root_rank) {
    v = (me - root + n) % n;
    parent = v == 0 ? -1 : ((v - 1) / 2 + root) % n;
    for (int cv : {2 * v + 1, 2 * v + 2}) {
      if (cv < n) children.push_back((cv + root) % n);
    }
    // Four slots per half: two for the reduce pass, two for the broadcast pass.
    slot_bytes = (ctx.half_bytes() / 4) & ~size_t(63);
  }
  char* up_slot(int r, uint64_t g) const { return c.half(r) + (g & 1) * slot_bytes; }
  char* down_slot(int r, uint64_t g) const { return c.half(r) + (2 + (g & 1)) * slot_bytes; }
  ControlBlock& ctl(int r) { return c.t.control(r); }
};

const IntSetting kTreeSegmentBytes("PYCOLL_TREE_SEGMENT_BYTES", 256 << 10, 64, int64_t(1) << 30, "cpu engine", true,
                                   Audience::Developer,
                                   "Segment of the CPU tree's pipeline, in bytes (at most a slot): small enough that "
                                   "the tree levels overlap.",
                                   nullptr, /*bytes=*/true);

// Segment size in elements: small enough that the tree levels overlap.
int64_t segment_elems(size_t slot_bytes, size_t elem) {
  static const int64_t want = kTreeSegmentBytes.get();
  const size_t bytes = std::min<size_t>(slot_bytes, static_cast<size_t>(std::max<int64_t>(want, 64)));
  return static_cast<int64_t>(bytes / elem);
}

}  // namespace

void tree_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count, int root) {
  Tree tr(c, root);
  const size_t E = dtype_size(spec.dtype);
  const int64_t seg = segment_elems(tr.slot_bytes, acc_size(spec.dtype));
  std::vector<Operand> srcs;
  for (int64_t off = 0; off < count; off += seg) {
    const int64_t len = std::min(seg, count - off);
    const uint64_t g = ++c.up_step;
    srcs.assign(1, Operand{in + off * E, false});
    for (int ch : tr.children) {
      c.w.until_ge(ch, tr.ctl(ch).up_ready.value, g, "tree partial from child");
      srcs.push_back({tr.up_slot(ch, g), true});
    }
    if (tr.v == 0) {
      reduce_operands(spec, out + off * E, false, srcs.data(), static_cast<int>(srcs.size()), len, true);
    } else {
      if (g > 2) c.w.until_ge(tr.parent, tr.ctl(tr.parent).up_consumed.value, g - 2, "tree parent read");
      reduce_operands(spec, tr.up_slot(tr.me, g), true, srcs.data(), static_cast<int>(srcs.size()), len, false);
      tr.ctl(tr.me).up_ready.value.store(g, std::memory_order_release);
    }
    tr.ctl(tr.me).up_consumed.value.store(g, std::memory_order_release);
  }
}

void tree_broadcast(CpuContext& c, DType t, char* buf, int64_t count, int root) {
  Tree tr(c, root);
  const size_t E = dtype_size(t);
  const int64_t seg = segment_elems(tr.slot_bytes, E);
  for (int64_t off = 0; off < count; off += seg) {
    const int64_t len = std::min(seg, count - off);
    const uint64_t g = ++c.down_step;
    const char* src = buf + off * E;
    if (tr.v != 0) {
      c.w.until_ge(tr.parent, tr.ctl(tr.parent).down_ready.value, g, "tree data from parent");
      src = tr.down_slot(tr.parent, g);
      std::memcpy(buf + off * E, src, len * E);
    }
    if (!tr.children.empty()) {
      if (g > 2) {
        for (int ch : tr.children) c.w.until_ge(ch, tr.ctl(ch).down_consumed.value, g - 2, "tree child read");
      }
      std::memcpy(tr.down_slot(tr.me, g), src, len * E);
      tr.ctl(tr.me).down_ready.value.store(g, std::memory_order_release);
    }
    tr.ctl(tr.me).down_consumed.value.store(g, std::memory_order_release);
  }
}

void tree_all_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count) {
  tree_reduce(c, spec, in, out, count, 0);
  tree_broadcast(c, spec.dtype, out, count, 0);
  ++c.phase;
  c.barrier();
}

}  // namespace pycoll

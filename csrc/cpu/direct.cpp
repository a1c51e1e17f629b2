#include "cpu/direct.h"

#include <cstring>

namespace pycoll {

namespace {
inline size_t esize(DType t) { return dtype_size(t); }
}  // namespace

int64_t oneshot_chunk_elems(const CpuContext& c, DType t) { return static_cast<int64_t>(c.half_bytes() / esize(t)); }

void oneshot_all_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count,
                        bool first_published) {
  const size_t E = esize(spec.dtype);
  const int64_t chunk = oneshot_chunk_elems(c, spec.dtype);
  const int n = c.size(), me = c.rank();
  std::vector<Operand> srcs(n);
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t len = std::min(chunk, count - off);
    if (!(first_published && off == 0)) {
      std::memcpy(c.half(me), in + off * E, len * E);
      c.barrier();
    }
    // Fixed order 0..n-1: every rank computes exactly the same sum.
    for (int r = 0; r < n; ++r) srcs[r] = {r == me ? in + off * E : c.half(r), false};
    reduce_operands(spec, out + off * E, false, srcs.data(), n, len, true);
    ++c.phase;
  }
}

void direct_all_gather(CpuContext& c, DType t, const char* in, char* out, int64_t m) {
  const size_t E = esize(t);
  const int64_t chunk = static_cast<int64_t>(c.half_bytes() / E);
  const int n = c.size(), me = c.rank();
  for (int64_t off = 0; off < m; off += chunk) {
    const int64_t len = std::min(chunk, m - off);
    std::memcpy(c.half(me), in + off * E, len * E);
    c.barrier();
    for (int r = 0; r < n; ++r) std::memcpy(out + (r * m + off) * E, c.half(r), len * E);
    ++c.phase;
  }
}

void direct_reduce_scatter(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t m) {
  const size_t E = esize(spec.dtype);
  const int n = c.size(), me = c.rank();
  const int64_t chunk = static_cast<int64_t>(c.half_bytes() / (E * n));
  std::vector<Operand> srcs(n);
  for (int64_t off = 0; off < m; off += chunk) {
    const int64_t len = std::min(chunk, m - off);
    for (int j = 0; j < n; ++j) std::memcpy(c.half(me) + j * len * E, in + (j * m + off) * E, len * E);
    c.barrier();
    for (int r = 0; r < n; ++r) srcs[r] = {c.half(r) + me * len * E, false};
    reduce_operands(spec, out + off * E, false, srcs.data(), n, len, true);
    ++c.phase;
  }
}

void direct_broadcast(CpuContext& c, DType t, char* buf, int64_t count, int root) {
  const size_t E = esize(t);
  const int64_t chunk = static_cast<int64_t>(c.half_bytes() / E);
  const int me = c.rank();
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t len = std::min(chunk, count - off);
    if (me == root) std::memcpy(c.half(root), buf + off * E, len * E);
    c.barrier();
    if (me != root) std::memcpy(buf + off * E, c.half(root), len * E);
    ++c.phase;
  }
}

void direct_reduce(CpuContext& c, const ReduceSpec& spec, const char* in, char* out, int64_t count, int root) {
  const size_t E = esize(spec.dtype);
  const int64_t chunk = static_cast<int64_t>(c.half_bytes() / E);
  const int n = c.size(), me = c.rank();
  std::vector<Operand> srcs(n);
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t len = std::min(chunk, count - off);
    std::memcpy(c.half(me), in + off * E, len * E);
    c.barrier();
    if (me == root) {
      for (int r = 0; r < n; ++r) srcs[r] = {c.half(r), false};
      reduce_operands(spec, out + off * E, false, srcs.data(), n, len, true);
    }
    ++c.phase;
  }
}

void direct_gather(CpuContext& c, DType t, const char* in, char* out, int64_t m, int root) {
  const size_t E = esize(t);
  const int64_t chunk = static_cast<int64_t>(c.half_bytes() / E);
  const int n = c.size(), me = c.rank();
  for (int64_t off = 0; off < m; off += chunk) {
    const int64_t len = std::min(chunk, m - off);
    std::memcpy(c.half(me), in + off * E, len * E);
    c.barrier();
    if (me == root) {
      for (int r = 0; r < n; ++r) std::memcpy(out + (r * m + off) * E, c.half(r), len * E);
    }
    ++c.phase;
  }
}

void direct_scatter(CpuContext& c, DType t, const char* in, char* out, int64_t m, int root) {
  const size_t E = esize(t);
  const int n = c.size(), me = c.rank();
  const int64_t chunk = static_cast<int64_t>(c.half_bytes() / (E * n));
  for (int64_t off = 0; off < m; off += chunk) {
    const int64_t len = std::min(chunk, m - off);
    if (me == root) {
      for (int j = 0; j < n; ++j) std::memcpy(c.half(root) + j * len * E, in + (j * m + off) * E, len * E);
    }
    c.barrier();
    std::memcpy(out + off * E, c.half(root) + me * len * E, len * E);
    ++c.phase;
  }
}

void direct_all_to_all(CpuContext& c, const char* in, char* out, const std::vector<int64_t>& send_bytes,
                       const std::vector<int64_t>& send_off, const std::vector<int64_t>& recv_bytes,
                       const std::vector<int64_t>& recv_off, int64_t max_block) {
  const int n = c.size(), me = c.rank();
  const int64_t q = static_cast<int64_t>((c.half_bytes() / n) & ~size_t(63));  // bytes per destination per round
  for (int64_t done = 0; done < max_block; done += q) {
    for (int d = 0; d < n; ++d) {
      const int64_t len = std::min(q, send_bytes[d] - done);
      if (len > 0) std::memcpy(c.half(me) + d * q, in + send_off[d] + done, len);
    }
    c.barrier();
    for (int s = 0; s < n; ++s) {
      const int64_t len = std::min(q, recv_bytes[s] - done);
      if (len > 0) std::memcpy(out + recv_off[s] + done, c.half(s) + me * q, len);
    }
    ++c.phase;
  }
}

}  // namespace pycoll

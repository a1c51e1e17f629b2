#include "cpu/peer_read.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "cpu/context.h"
#include "common/check.h"
#include "common/test_hooks.h"
#include "cpu/kernels/stream_store.h"

namespace pycoll {

namespace {

// A reduce_scatter reads this much of each peer's block per call: small enough that the chunks of
// a few peers stay in the core's L2 while they are reduced (n x 128 KiB per lane), large enough
// that the call's own cost (one syscall and a page-table walk) spreads over 32 pages.
constexpr size_t kPeerReadChunkBytes = 128 << 10;

// process_vm_readv returns fewer bytes than asked only when it stops at an error part way.
ssize_t read_some(int64_t pid, void* local, const void* remote, size_t n) {
  if (test_hooks::deny_peer_read()) {
    errno = EPERM;
    return -1;
  }
  iovec l{local, n};
  iovec r{const_cast<void*>(remote), n};
  return process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
}

void read_peer(const Pipeline& p, int peer, const char* remote, char* local, size_t n) {
  const int64_t pid = p.t.control(peer).pid;
  while (n > 0) {
    const ssize_t got = read_some(pid, local, remote, n);
    if (got <= 0) {
      const int err = errno;
      throw GroupBroken(str("pycoll: reading rank ", peer, "'s buffer in place (process_vm_readv) failed: ",
                            std::strerror(err), p.t.peer_alive(peer) ? "" : " (the peer's process has exited)"));
    }
    local += got;
    remote += got;
    n -= static_cast<size_t>(got);
  }
}

}  // namespace

bool can_read_peer(int64_t pid, const void* remote, int* err) {
  char probe;
  *err = read_some(pid, &probe, remote, 1) == 1 ? 0 : (errno != 0 ? errno : EFAULT);
  return *err == 0;
}

void peer_read_all_gather(Pipeline& p, const int64_t* addrs, DType t, const char* in, char* out, int64_t m) {
  const size_t E = dtype_size(t);
  const int n = p.t.size(), me = p.t.rank();
  const bool in_place = in == out + me * m * E;
  run_lanes(p, [&](int lane) {
    const int64_t b = part_begin(m, p.lanes, lane), len = part_end(m, p.lanes, lane) - b;
    if (len == 0) return;
    if (!in_place) copy_to_output(p.stream_out, out + (me * m + b) * E, in + b * E, len * E);
    // Peers in ring order from me, so that the ranks do not all read rank 0 first.
    for (int k = 1; k < n; ++k) {
      const int q = (me + k) % n;
      read_peer(p, q, reinterpret_cast<const char*>(addrs[q]) + b * E, out + (q * m + b) * E, len * E);
    }
  });
}

void peer_read_reduce_scatter(Pipeline& p, const ReduceSpec& spec, const int64_t* addrs, const char* in, char* out,
                              int64_t m) {
  const size_t E = dtype_size(spec.dtype);
  const int n = p.t.size(), me = p.t.rank();
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(kPeerReadChunkBytes / E));
  run_lanes(p, [&](int lane) {
    const int64_t lane_b = part_begin(m, p.lanes, lane), lane_e = part_end(m, p.lanes, lane);
    if (lane_b == lane_e) return;
    // Lanes run on the pool's long-lived threads: the buffer is allocated (and faulted in) once.
    thread_local std::vector<char> peers_chunks;
    const size_t want = static_cast<size_t>(n) * static_cast<size_t>(std::min(chunk, lane_e - lane_b)) * E;
    if (peers_chunks.size() < want) peers_chunks.resize(want);
    std::vector<Operand> srcs(n);
    for (int64_t b = lane_b; b < lane_e; b += chunk) {
      const size_t bytes = static_cast<size_t>(std::min(chunk, lane_e - b)) * E;
      const size_t at = static_cast<size_t>(me * m + b) * E;
      auto chunk_of = [&](int r) { return peers_chunks.data() + static_cast<size_t>(r) * bytes; };
      for (int k = 1; k < n; ++k) {  // ring order from me, so that the ranks do not all read rank 0 first
        const int q = (me + k) % n;
        read_peer(p, q, reinterpret_cast<const char*>(addrs[q]) + at, chunk_of(q), bytes);
      }
      for (int r = 0; r < n; ++r) srcs[r] = {r == me ? in + at : chunk_of(r), false};
      reduce_operands(spec, out + b * E, false, srcs.data(), n, static_cast<int64_t>(bytes / E), true);
    }
  });
}

void peer_read_broadcast(Pipeline& p, const int64_t* addrs, DType t, char* buf, int64_t count, int root) {
  if (p.t.rank() == root) return;  // the caller's closing barrier waits for every reader
  const size_t E = dtype_size(t);
  run_lanes(p, [&](int lane) {
    const int64_t b = part_begin(count, p.lanes, lane), len = part_end(count, p.lanes, lane) - b;
    if (len > 0) read_peer(p, root, reinterpret_cast<const char*>(addrs[root]) + b * E, buf + b * E, len * E);
  });
}

}  // namespace pycoll

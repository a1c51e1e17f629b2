#include "cpu/shared_storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/test_hooks.h"
#include "cpu/kernels/stream_store.h"

namespace pycoll {

namespace {
// all_reduce's chunk: reduced, then copied to every peer from L2 (1 MiB per core on the CI
// machine, 2 MiB on the Xeons).
constexpr int64_t kSharedAllReduceChunkBytes = 64 << 10;
}  // namespace

PeerFileMaps::~PeerFileMaps() {
  for (const Mapping& m : maps_) munmap(m.base, static_cast<size_t>(m.bytes));
}

bool PeerFileMaps::lasting(int err) {
  return err == EACCES || err == EPERM || err == EROFS || err == ENOENT || err == ESRCH || err == ESTALE;
}

bool PeerFileMaps::make_room(int peer, int64_t adding) {
  bool evicted = false;
  for (;;) {
    int files = 0;
    int64_t bytes = adding;
    auto oldest = maps_.end();
    for (auto it = maps_.begin(); it != maps_.end(); ++it) {
      if (it->peer != peer) continue;
      ++files;
      bytes += it->bytes;
      if (it->last_use < op_start_ && (oldest == maps_.end() || it->last_use < oldest->last_use)) oldest = it;
    }
    if ((files < kMapsPerPeer && bytes <= kBytesPerPeer) || oldest == maps_.end()) return evicted;
    munmap(oldest->base, static_cast<size_t>(oldest->bytes));
    maps_.erase(oldest);
    evicted = true;
  }
}

char* PeerFileMaps::cached(int peer, const SharedStorageRef& ref, bool writable) {
  ++clock_;
  for (Mapping& m : maps_) {
    // While mapped, the file cannot be freed, so its (dev, ino) names no other file.
    if (m.peer == peer && m.dev == ref.dev && m.ino == ref.ino && m.bytes >= ref.file_bytes &&
        (m.writable || !writable)) {
      m.last_use = clock_;
      return static_cast<char*>(m.base) + ref.offset;
    }
  }
  return nullptr;
}

char* PeerFileMaps::map(int peer, int64_t pid, const SharedStorageRef& ref, bool writable, int* err, bool* evicted) {
  *evicted = false;
  if (char* p = cached(peer, ref, writable)) return p;
  if (test_hooks::deny_shared_open()) {
    *err = EACCES;
    return nullptr;
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(ref.fd);
  const int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return nullptr;
  }
  struct stat st{};
  // Another file under that name means /proc shows another process than the peer (ranks in
  // different PID namespaces): never read it.
  if (fstat(fd, &st) != 0) {
    *err = errno;
    close(fd);
    return nullptr;
  }
  if (static_cast<uint64_t>(st.st_dev) != ref.dev || static_cast<uint64_t>(st.st_ino) != ref.ino ||
      st.st_size < ref.file_bytes) {
    *err = ESTALE;
    close(fd);
    return nullptr;
  }
  void* base = mmap(nullptr, static_cast<size_t>(ref.file_bytes), writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    MAP_SHARED, fd, 0);
  const int map_err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    *err = map_err;
    return nullptr;
  }
  *evicted = make_room(peer, ref.file_bytes);
  maps_.push_back(Mapping{peer, ref.dev, ref.ino, ref.file_bytes, writable, base, clock_});
  return static_cast<char*>(base) + ref.offset;
}

void shared_all_gather(Pipeline& p, DType t, const std::vector<const char*>& ins, char* out, int64_t m) {
  const size_t E = dtype_size(t);
  const int n = p.t.size(), me = p.t.rank();
  const bool in_place = ins[me] == out + me * m * E;
  run_lanes(p, [&](int lane) {
    const int64_t b = part_begin(m, p.lanes, lane), len = part_end(m, p.lanes, lane) - b;
    if (len == 0) return;
    // Peers in ring order from me, so that the ranks do not all read rank 0 first.
    for (int k = in_place ? 1 : 0; k < n; ++k) {
      const int q = (me + k) % n;
      copy_to_output(p.stream_out, out + (q * m + b) * E, ins[q] + b * E, len * E);
    }
  });
}

void shared_broadcast(Pipeline& p, DType t, const char* root_buf, const std::vector<char*>& bufs, bool root_writes,
                      int64_t count, int root) {
  const size_t E = dtype_size(t);
  const int n = p.t.size(), me = p.t.rank();
  // Part q goes to rank q from the root; part `root` and the parts of other ranks each reader
  // copies itself.
  const auto copy_part = [&](char* dst, int part, int lane) {
    const int64_t s = part_begin(count, n, part), s_len = part_end(count, n, part) - s;
    const int64_t b = s + part_begin(s_len, p.lanes, lane),
                  len = part_end(s_len, p.lanes, lane) - part_begin(s_len, p.lanes, lane);
    if (len > 0) std::memcpy(dst + b * E, root_buf + b * E, len * E);
  };
  run_lanes(p, [&](int lane) {
    for (int k = 1; k < n; ++k) {
      const int q = (me + k) % n;  // peers in ring order from me: not every reader at part 0 first
      if (me == root) {
        if (root_writes) copy_part(bufs[q], q, lane);
      } else if (q != me) {
        copy_part(bufs[me], q, lane);
      }
    }
    if (me != root && !root_writes) copy_part(bufs[me], me, lane);
  });
}

void shared_reduce_scatter(Pipeline& p, const ReduceSpec& spec, const std::vector<const char*>& ins, char* out,
                           int64_t m) {
  const size_t E = dtype_size(spec.dtype);
  const int n = p.t.size(), me = p.t.rank();
  run_lanes(p, [&](int lane) {
    const int64_t b = part_begin(m, p.lanes, lane), len = part_end(m, p.lanes, lane) - b;
    if (len == 0) return;
    std::vector<Operand> srcs(n);
    for (int r = 0; r < n; ++r) srcs[r] = {ins[r] + (me * m + b) * E, false};
    reduce_operands(spec, out + b * E, false, srcs.data(), n, len, true);
  });
}

void shared_all_reduce(Pipeline& p, const ReduceSpec& spec, const std::vector<const char*>& ins,
                       const std::vector<char*>& outs, int64_t count) {
  const size_t E = dtype_size(spec.dtype);
  const int n = p.t.size(), me = p.t.rank();
  // A chunk reduced into my output is still in cache when it is copied to the peers'.
  const int64_t chunk = std::max<int64_t>(1, kSharedAllReduceChunkBytes / static_cast<int64_t>(E));
  const int64_t mine = part_begin(count, n, me), mine_len = part_end(count, n, me) - mine;
  run_lanes(p, [&](int lane) {
    const int64_t lane_b = mine + part_begin(mine_len, p.lanes, lane);
    const int64_t lane_e = mine + part_end(mine_len, p.lanes, lane);
    std::vector<Operand> srcs(n);
    for (int64_t b = lane_b; b < lane_e; b += chunk) {
      const int64_t len = std::min(chunk, lane_e - b);
      for (int r = 0; r < n; ++r) srcs[r] = {ins[r] + b * E, false};
      reduce_operands(spec, outs[me] + b * E, false, srcs.data(), n, len, true);
      for (int k = 1; k < n; ++k) {
        const int q = (me + k) % n;
        std::memcpy(outs[q] + b * E, outs[me] + b * E, len * E);
      }
    }
  });
}

}  // namespace pycoll

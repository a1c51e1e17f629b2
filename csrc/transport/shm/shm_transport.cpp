#include "transport/shm/shm_transport.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <csignal>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <stdexcept>
#include <unistd.h>

#include "common/arith.h"
#include "common/check.h"

namespace pycoll {

namespace {

constexpr size_t kAlign = 4096;

std::string random_token() {
  // /dev/urandom so two jobs started in the same second still differ.
  unsigned char buf[8];
  std::ifstream f("/dev/urandom", std::ios::binary);
  if (!f.read(reinterpret_cast<char*>(buf), sizeof(buf))) {
    std::random_device rd;
    for (auto& b : buf) b = static_cast<unsigned char>(rd());
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : buf) {
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

}  // namespace

size_t ShmTransport::segment_bytes() const {
  return round_up(sizeof(ControlBlock), kAlign) + data_bytes_ + channel_bytes_ * static_cast<size_t>(size_);
}

ShmTransport::ShmTransport(const Rendezvous& rv, int rank, int size, size_t data_bytes, size_t channel_bytes,
                           std::chrono::milliseconds timeout)
    : rank_(rank),
      size_(size),
      data_bytes_(round_up(data_bytes, kAlign)),
      channel_bytes_(round_up(channel_bytes, kAlign)) {
  if (size > kMaxRanks) {
    throw std::invalid_argument(
        str("pycoll: the shared-memory transport supports at most ", kMaxRanks, " ranks per host, got ", size));
  }
  std::string token;
  if (rank == 0) {
    token = random_token();
    rv.set(rv.prefix + "shm_token", token);
  } else {
    token = rv.get(rv.prefix + "shm_token");
  }
  auto name_of = [&](int r) { return str("/pycoll-", token, "-", r); };

  segments_.resize(size);
  pids_.assign(size, 0);
  segments_[rank] = ShmSegment::create(name_of(rank), segment_bytes());
  new (segments_[rank].base()) ControlBlock();
  control(rank).pid = static_cast<int64_t>(getpid());
  rv.set(rv.prefix + str("shm_ready_", rank), std::to_string(getpid()));

  // Map every peer; whoever fails unlinks every name it knows so that a
  // half-built group leaves nothing behind.
  try {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      pids_[r] = std::stoll(rv.get(rv.prefix + str("shm_ready_", r)));
      segments_[r] = ShmSegment::open(name_of(r), segment_bytes());
    }
    pids_[rank] = getpid();
    rv.add(rv.prefix + "shm_mapped", 1);
    // Once everyone has mapped, nobody needs the names: unlink now, so that
    // even SIGKILL of any rank leaves no segment in /dev/shm.
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (rv.add(rv.prefix + "shm_mapped", 0) < size) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error(str("pycoll: rank ", rank, " timed out after ", timeout.count(),
                                     " ms waiting for every rank to map the shared-memory workspace"));
      }
      usleep(200);
    }
  } catch (...) {
    for (int r = 0; r < size; ++r) ShmSegment::unlink(name_of(r));
    throw;
  }
  ShmSegment::unlink(name_of(rank));
}

char* ShmTransport::data(int r) { return segments_[r].base() + round_up(sizeof(ControlBlock), kAlign); }

ControlBlock& ShmTransport::control(int r) { return *reinterpret_cast<ControlBlock*>(segments_[r].base()); }

char* ShmTransport::channel(int src, int dst) {
  return segments_[src].base() + round_up(sizeof(ControlBlock), kAlign) + data_bytes_ +
         channel_bytes_ * static_cast<size_t>(dst);
}

namespace {

// A process that has exited but whose parent has not reaped it yet (a zombie, state Z, or X while
// it is being reaped) still answers kill(pid, 0): its state in /proc/<pid>/stat tells it apart.
// "pid (comm) state ...": comm may hold spaces and parentheses, so the state follows the last ')'.
bool has_exited(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');
  if (close_paren == nullptr || close_paren[1] != ' ') return false;
  const char state = close_paren[2];
  return state == 'Z' || state == 'X' || state == 'x';
}

}  // namespace

bool ShmTransport::peer_alive(int r) {
  if (r == rank_ || pids_[r] <= 0) return true;
  const auto pid = static_cast<pid_t>(pids_[r]);
  if (kill(pid, 0) != 0) return errno != ESRCH;
  return !has_exited(pid);
}

}  // namespace pycoll

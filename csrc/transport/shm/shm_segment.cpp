#include "transport/shm/shm_segment.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"

namespace pycoll {

namespace {
// MAP_POPULATE: the pages are faulted in now, at group creation, not during the first large ops
// (a process's resident memory then stays flat while it runs; the soak test checks that).
void* map_fd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    throw std::runtime_error(
        str("pycoll: mmap of shared memory ", name, " (", bytes, " bytes) failed: ", std::strerror(err)));
  }
  return p;
}
}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, S_IRUSR | S_IWUSR);
  if (fd < 0) {
    int err = errno;
    throw std::runtime_error(str("pycoll: shm_open(create) ", name, " failed: ", std::strerror(err)));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw std::runtime_error(str("pycoll: sizing shared memory ", name, " to ", bytes, " bytes failed: ",
                                 std::strerror(err), " (is /dev/shm large enough? set PYCOLL_SHM_BYTES lower)"));
  }
  ShmSegment s;
  try {
    s.addr_ = map_fd(fd, bytes, name);
  } catch (...) {
    close(fd);
    shm_unlink(name.c_str());
    throw;
  }
  close(fd);
  s.bytes_ = bytes;
  s.name_ = name;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    int err = errno;
    throw std::runtime_error(str("pycoll: shm_open ", name, " failed: ", std::strerror(err)));
  }
  ShmSegment s;
  try {
    s.addr_ = map_fd(fd, bytes, name);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  s.bytes_ = bytes;
  s.name_ = name;
  return s;
}

void ShmSegment::unlink(const std::string& name) { shm_unlink(name.c_str()); }

ShmSegment::ShmSegment(ShmSegment&& o) noexcept : addr_(o.addr_), bytes_(o.bytes_), name_(std::move(o.name_)) {
  o.addr_ = nullptr;
  o.bytes_ = 0;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    if (addr_) munmap(addr_, bytes_);
    addr_ = o.addr_;
    bytes_ = o.bytes_;
    name_ = std::move(o.name_);
    o.addr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (addr_) munmap(addr_, bytes_);
}

}  // namespace pycoll

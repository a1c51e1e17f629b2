// One POSIX shared-memory segment: created (mode 0600) or opened by name, and
// mapped. Unlinking is separate from unmapping: the name is removed as soon as
// every peer has mapped it, so a crash afterwards leaves nothing in /dev/shm.
#pragma once

#include <cstddef>
#include <string>

namespace pycoll {

class ShmSegment {
 public:
  static ShmSegment create(const std::string& name, size_t bytes);
  static ShmSegment open(const std::string& name, size_t bytes);
  // Removes the name; ignores a name that is already gone.
  static void unlink(const std::string& name);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  char* base() const { return static_cast<char*>(addr_); }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  void* addr_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
};

}  // namespace pycoll

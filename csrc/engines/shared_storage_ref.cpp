#include "engines/shared_storage_ref.h"

#include <ATen/MapAllocator.h>
#include <sys/stat.h>

#include "engines/shared_cpu_allocator.h"

namespace pycoll {

SharedStorageRef shared_storage_of(const at::Tensor& t) {
  SharedStorageRef ref;
  if (!t.defined() || !t.device().is_cpu() || !t.has_storage() || !t.is_contiguous() || t.nbytes() == 0) return ref;
  const at::DataPtr& data = t.storage().data_ptr();
  const char* begin = static_cast<const char*>(t.data_ptr());
  const int64_t bytes = static_cast<int64_t>(t.nbytes());
  SharedBlockFile block;
  if (shared_block_file(data, &block)) {  // the shared CPU allocator's: its file is open while it lives
    const int64_t offset = begin - block.base;
    if (offset < 0 || offset + bytes > block.bytes) return ref;
    ref.fd = block.fd;
    ref.file_bytes = block.bytes;
    ref.dev = block.dev;
    ref.ino = block.ino;
    ref.offset = offset;
    return ref;
  }
  at::MapAllocator* map = at::MapAllocator::fromDataPtr(data);
  // KEEPFD: the file stays open for the storage's lifetime, so /proc/<pid>/fd/<fd> names it
  // while the op runs. Without it (a named file mapped and closed) there is nothing to reopen.
  if (map == nullptr || (map->flags() & at::ALLOCATOR_MAPPED_KEEPFD) == 0 || map->fd() < 0) return ref;
  struct stat st{};
  if (fstat(map->fd(), &st) != 0) return ref;
  const char* base = static_cast<const char*>(map->data());
  const int64_t offset = begin - base;
  if (offset < 0 || offset + bytes > static_cast<int64_t>(map->size()) || offset + bytes > st.st_size) return ref;
  ref.fd = map->fd();
  ref.file_bytes = static_cast<int64_t>(map->size());
  ref.dev = static_cast<uint64_t>(st.st_dev);
  ref.ino = static_cast<uint64_t>(st.st_ino);
  ref.offset = offset;
  return ref;
}

}  // namespace pycoll

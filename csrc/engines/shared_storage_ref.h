// Which CPU tensors live in a shared-memory file that peers may map: what the CPU engine needs to
// read them in place (cpu/shared_storage.h).
//
// torch's share_memory_() (the default "file_descriptor" sharing strategy on Linux) moves a
// storage into an unlinked shared-memory file and keeps it open; its storage's DataPtr is then an
// at::MapAllocator with that fd. The shared CPU allocator's blocks (engines/shared_cpu_allocator.h)
// are such files too. Any other storage (plain malloc'd memory, the "file_system"
// strategy's libshm allocator, a CUDA tensor) gets an invalid reference and is staged as before.
#pragma once

#include <ATen/ATen.h>

#include "transport/transport.h"

namespace pycoll {

// The shared file behind t's bytes, or an invalid reference. t must be contiguous for the bytes
// the op moves to be one range of the file.
SharedStorageRef shared_storage_of(const at::Tensor& t);

}  // namespace pycoll

// An opt-in CPU allocator that puts large tensors in shared memory from the moment they are made,
// so that large CPU collectives read the peers' tensors in place (cpu/shared_storage.h)
// without the program calling share_memory_() on each: DDP's gradient buckets, FSDP's flat
// parameters, a benchmark's buffers. pycollectives.use_shared_cpu_memory() or
// PYCOLL_CPU_ALLOCATOR=shared turns it on.
//
// Each allocation of at least min_bytes is its own memfd file, mapped shared and kept open (a peer
// opens it through /proc/<pid>/fd/<fd>, as it does torch's share_memory_() files); smaller ones,
// and any the file budget or the kernel refuses, go to the allocator that was current before.
// memfd files have no name, so nothing is left in /dev/shm whatever way the process ends, and
// they do not count against /dev/shm's size (a 64 MiB container /dev/shm does not fault them).
//
// Freed blocks are kept for reuse, up to a cap (PYCOLL_SHARED_CPU_CACHE_BYTES): a training step
// frees and allocates the same sizes again, and a fresh file costs three system calls and a page
// fault per page, where the default allocator's heap reuses its memory. A reused block is also a
// file the peers have mapped already, so their ops open nothing.
//
// fork(): blocks allocated before a fork stay shared between parent and child (as share_memory_()
// tensors do); the child never reuses the parent's freed blocks.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>

namespace pycoll {

// The file behind a DataPtr this allocator made, or false for any other DataPtr.
struct SharedBlockFile {
  int fd = -1;
  const char* base = nullptr;  // where the file is mapped in this process
  int64_t bytes = 0;           // the mapping's (and the file's) length
  uint64_t dev = 0, ino = 0;
};
bool shared_block_file(const at::DataPtr& data, SharedBlockFile* out);

// Makes the shared allocator torch's CPU allocator, for allocations of at least min_bytes (0: the
// setting's value). Raises if another allocator of higher priority is installed.
void install_shared_cpu_allocator(int64_t min_bytes);
// Puts back the allocator that was current before; blocks already made stay valid and are freed
// (or cached) as before. A no-op if not installed.
void uninstall_shared_cpu_allocator();
bool shared_cpu_allocator_installed();

struct SharedCpuAllocatorStats {
  int64_t min_bytes = 0;
  int64_t live_blocks = 0, live_bytes = 0;      // handed out and not yet freed (this process)
  int64_t cached_blocks = 0, cached_bytes = 0;  // freed, kept for reuse
  int64_t made = 0;                             // new files
  int64_t reused = 0;                           // allocations served from the cache
  int64_t fallbacks = 0;                        // large allocations that went to the previous allocator
  int64_t file_budget = 0;                      // most files (live + cached) held at once
};
SharedCpuAllocatorStats shared_cpu_allocator_stats();
// Drops every cached block (tests; memory pressure).
void release_cached_shared_blocks();
// Reads PYCOLL_CPU_ALLOCATOR; installs when it says "shared". Called once at import.
void apply_cpu_allocator_setting();

}  // namespace pycoll

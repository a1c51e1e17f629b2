#include "engines/shared_cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/env.h"
#include "common/setting.h"

namespace pycoll {
namespace {

const TextSetting kCpuAllocator(
    "PYCOLL_CPU_ALLOCATOR", "default", "default, shared", "cpu engine", false, Audience::User,
    "shared: from `import pycollectives` on, every CPU tensor of at least PYCOLL_SHARED_CPU_MIN_BYTES lives in a "
    "shared-memory file, so large CPU collectives read peers' tensors in place instead of staging them "
    "(pycollectives.use_shared_cpu_memory() does the same from Python).");
// docs/decisions/0019-shared-cpu-allocator-opt-in.md
// 256 KiB: from there the CPU engine pipelines an op and reads shared buffers in place
// (kPipelineMinBytes in cpu/cpu_engine.cpp); a smaller tensor would only cost a file.
const IntSetting kSharedMinBytes("PYCOLL_SHARED_CPU_MIN_BYTES", 256 << 10, 4096, int64_t(1) << 40, "cpu engine", false,
                                 Audience::User,
                                 "The shared CPU allocator (PYCOLL_CPU_ALLOCATOR=shared) puts tensors of at least "
                                 "this many bytes in shared memory; smaller ones use torch's allocator.",
                                 nullptr, /*bytes=*/true);
const IntSetting kSharedCacheBytes("PYCOLL_SHARED_CPU_CACHE_BYTES", 256 << 20, 0, int64_t(1) << 40, "cpu engine", false,
                                   Audience::User,
                                   "Freed shared-memory tensors the shared CPU allocator keeps for reuse, in bytes "
                                   "(a training step allocates the same sizes again).",
                                   nullptr, /*bytes=*/true);

// A model's parameters, gradients and optimizer state can be hundreds of tensors above the
// threshold, all made before DDP makes its buckets: under a soft limit of 1,024 descriptors the
// budget below (256 files) would be spent before the buffers that are communicated. So, as many
// servers do at start-up, the soft limit is raised to the hard one (at most 65,536).
void raise_descriptor_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
  const rlim_t want = rl.rlim_max == RLIM_INFINITY ? rlim_t(65536) : std::min<rlim_t>(rl.rlim_max, 65536);
  if (want <= rl.rlim_cur) return;
  rl.rlim_cur = want;
  setrlimit(RLIMIT_NOFILE, &rl);
}

// Files the allocator may hold open at once: a quarter of the process's descriptor limit, so that
// sockets and files the program opens itself never run out because of tensors, and a quarter of
// the kernel's mappings per process (vm.max_map_count; each block is one mapping), so that
// malloc, thread stacks and CUDA still get theirs.
int64_t file_budget() {
  int64_t budget = 65536;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    budget = std::min<int64_t>(budget, static_cast<int64_t>(rl.rlim_cur) / 4);
  }
  if (FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    long long maps = 0;
    if (std::fscanf(f, "%lld", &maps) == 1 && maps > 0) budget = std::min<int64_t>(budget, maps / 4);
    std::fclose(f);
  }
  return budget;
}

// Block sizes come in classes an eighth of a power of two apart (whole pages), so that tensors of
// nearby sizes (a batch with another sequence length) reuse each other's freed blocks: a new
// block costs a page fault per page, and shared-memory faults cost more than private ones
// (docs/decisions/0019-shared-cpu-allocator-opt-in.md). At most 1/8 of a block goes unused.
int64_t size_class(size_t n) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t bytes = static_cast<int64_t>(n);
  int64_t pow2 = page;
  while (pow2 * 2 <= bytes) pow2 *= 2;
  const int64_t step = std::max(page, pow2 / 8);
  return (bytes + step - 1) / step * step;
}

struct Block {
  SharedBlockFile file;  // file.fd < 0: no longer peer-mappable (made private in a forked child)
  uint64_t fork_gen;     // forks seen when it was handed out: a block live across a fork is never reused
};

void free_block(void* ptr);

// The DataPtr's context is its data pointer (torch's "simple" DataPtr, which raw_allocate,
// raw_deleter and lazy clones need); a registry finds the block from it.
class SharedCpuAllocator final : public at::Allocator {
 public:
  at::DataPtr allocate(size_t n) override {
    if (n > 0 && enabled() && static_cast<int64_t>(n) >= min_bytes()) {
      if (Block* b = take(size_class(n))) {
        void* p = const_cast<char*>(b->file.base);
        return {p, p, &free_block, at::Device(at::kCPU)};
      }
    }
    return previous()->allocate(n);
  }
  at::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  void install(int64_t min_bytes) {
    std::lock_guard<std::mutex> g(mu_);
    at::Allocator* current = c10::GetCPUAllocator();
    if (current != this) previous_ = current;
    min_bytes_ = min_bytes;
    raise_descriptor_limit();
    budget_ = file_budget();
    cache_cap_ = kSharedCacheBytes.get();  // read here: a deleter must not throw on a bad value
    c10::SetCPUAllocator(this, /*priority=*/0);
    if (c10::GetCPUAllocator() != this) {
      throw std::runtime_error(
          "pycollectives: cannot install the shared CPU allocator: another CPU allocator of higher priority is in "
          "use (c10::SetCPUAllocator)");
    }
    enabled_ = true;
  }
  void uninstall() {
    std::unique_lock<std::mutex> g(mu_);
    if (!enabled_) return;
    enabled_ = false;
    // Only if it is still ours: one installed on top of it since stays.
    if (c10::GetCPUAllocator() == this) c10::SetCPUAllocator(previous_, /*priority=*/0);
    std::vector<Block*> out = trim(0);  // nothing takes from the cache while off
    g.unlock();
    for (Block* old : out) destroy(old);
  }
  bool enabled() const { return enabled_; }
  int64_t min_bytes() const { return min_bytes_; }
  at::Allocator* previous() const { return previous_; }

  // A pointer this allocator handed out, or any other CPU pointer freed through raw_deleter().
  void release(void* ptr) {
    std::unique_lock<std::mutex> g(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      g.unlock();
      // A small allocation the previous allocator made (raw_allocate goes through allocate()).
      if (at::DeleterFnPtr d = previous()->raw_deleter()) d(ptr);
      return;
    }
    Block* b = it->second;
    live_.erase(it);
    stats_.live_blocks -= 1;
    stats_.live_bytes -= b->file.bytes;
    // A block that was live at a fork() may still be mapped by the child (privately, over the same
    // file): reusing it would show the child another tensor's bytes. Not cached while off either.
    const int64_t cap = cache_cap_;
    if (b->fork_gen != fork_gen_ || b->file.fd < 0 || b->file.bytes > cap || !enabled_) {
      g.unlock();
      destroy(b);
      return;
    }
    cached_.push_back(b);
    stats_.cached_blocks += 1;
    stats_.cached_bytes += b->file.bytes;
    std::vector<Block*> out = trim(cap);
    g.unlock();
    for (Block* old : out) destroy(old);
  }

  bool file_of(const void* ptr, SharedBlockFile* out) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.find(ptr);
    if (it == live_.end() || it->second->file.fd < 0) return false;
    *out = it->second->file;
    return true;
  }

  void drop_cache() {
    std::unique_lock<std::mutex> g(mu_);
    std::vector<Block*> out = trim(0);
    g.unlock();
    for (Block* old : out) destroy(old);
  }

  SharedCpuAllocatorStats stats() {
    std::lock_guard<std::mutex> g(mu_);
    SharedCpuAllocatorStats s = stats_;
    s.min_bytes = min_bytes_;
    s.file_budget = budget_;
    return s;
  }

  // fork(): the child must not inherit a locked mutex. It forgets the parent's cached blocks
  // (the parent may reuse them) and makes every live block a private copy-on-write mapping of its
  // file: as with any fork, what the child writes stays its own. (Pages it has not written still
  // show what the parent writes later, as a MAP_PRIVATE mapping of a file does.) The parent never
  // reuses a block that was live at the fork (fork_gen).
  void before_fork() {
    mu_.lock();
    fork_gen_ += 1;
  }
  void after_fork_parent() { mu_.unlock(); }
  void after_fork_child() {
    for (Block* b : cached_) destroy(b);
    cached_.clear();
    stats_.cached_blocks = stats_.cached_bytes = 0;
    for (auto& [ptr, b] : live_) {
      if (b->file.fd < 0) continue;
      mmap(const_cast<void*>(ptr), static_cast<size_t>(b->file.bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED,
           b->file.fd, 0);
      close(b->file.fd);
      b->file.fd = -1;
    }
    mu_.unlock();
  }

 private:
  Block* take(int64_t bytes) {
    std::unique_lock<std::mutex> g(mu_);
    // Most recently freed first: its pages are the likeliest to be in cache.
    for (auto it = cached_.rbegin(); it != cached_.rend(); ++it) {
      Block* b = *it;
      if (b->file.bytes != bytes) continue;
      cached_.erase(std::next(it).base());
      stats_.cached_blocks -= 1;
      stats_.cached_bytes -= bytes;
      stats_.reused += 1;
      hand_out(b);
      return b;
    }
    if (stats_.live_blocks + stats_.cached_blocks >= budget_ && !make_room()) {
      return fall_back(g,
                       "the allocator holds its budget of open files (a quarter of RLIMIT_NOFILE and of "
                       "vm.max_map_count)",
                       0);
    }
    stats_.live_blocks += 1;  // reserves the file's place while the lock is dropped
    g.unlock();
    int err = 0;
    Block* b = make(bytes, &err);
    g.lock();
    stats_.live_blocks -= 1;
    if (b == nullptr) return fall_back(g, "the kernel refused a shared-memory file", err);
    stats_.made += 1;
    hand_out(b);
    return b;
  }

  void hand_out(Block* b) {
    b->fork_gen = fork_gen_;
    live_.emplace(b->file.base, b);
    stats_.live_blocks += 1;
    stats_.live_bytes += b->file.bytes;
  }

  // Frees the oldest cached block to make room for a new file; false if none is cached.
  bool make_room() {
    if (cached_.empty()) return false;
    Block* old = cached_.front();
    cached_.pop_front();
    stats_.cached_blocks -= 1;
    stats_.cached_bytes -= old->file.bytes;
    destroy(old);  // under the lock: rare (the budget is reached), and only munmap and close
    return true;
  }

  Block* fall_back(std::unique_lock<std::mutex>& g, const char* why, int err) {
    stats_.fallbacks += 1;
    const bool first = !warned_;
    warned_ = true;
    g.unlock();
    if (first && debug_info_enabled()) {
      std::fprintf(stderr, "[pycoll] shared CPU allocator: %s%s%s; tensors it cannot place use torch's allocator\n",
                   why, err != 0 ? ": " : "", err != 0 ? std::strerror(err) : "");
    }
    return nullptr;
  }

  static Block* make(int64_t bytes, int* err) {
    const int fd = memfd_create("pycoll-tensor", MFD_CLOEXEC);
    if (fd < 0) {
      *err = errno;
      return nullptr;
    }
    struct stat st{};
    void* base = MAP_FAILED;
    if (ftruncate(fd, bytes) == 0 && fstat(fd, &st) == 0) {
      base = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (base == MAP_FAILED) {
      *err = errno;
      close(fd);
      return nullptr;
    }
    SharedBlockFile f;
    f.fd = fd;
    f.base = static_cast<const char*>(base);
    f.bytes = bytes;
    f.dev = static_cast<uint64_t>(st.st_dev);
    f.ino = static_cast<uint64_t>(st.st_ino);
    return new Block{f, 0};
  }

  static void destroy(Block* b) {
    munmap(const_cast<char*>(b->file.base), static_cast<size_t>(b->file.bytes));
    if (b->file.fd >= 0) close(b->file.fd);
    delete b;
  }

  // Takes cached blocks out, oldest first, until at most `cap` bytes stay; the caller destroys
  // them outside the lock.
  std::vector<Block*> trim(int64_t cap) {
    std::vector<Block*> out;
    while (!cached_.empty() && stats_.cached_bytes > cap) {
      Block* old = cached_.front();
      cached_.pop_front();
      stats_.cached_blocks -= 1;
      stats_.cached_bytes -= old->file.bytes;
      out.push_back(old);
    }
    return out;
  }

  std::mutex mu_;
  std::atomic<at::Allocator*> previous_{nullptr};
  std::atomic<bool> enabled_{false};
  std::atomic<int64_t> min_bytes_{0};
  int64_t budget_ = 0;
  int64_t cache_cap_ = 0;
  uint64_t fork_gen_ = 0;
  bool warned_ = false;
  std::unordered_map<const void*, Block*> live_;  // by data pointer
  std::deque<Block*> cached_;                     // oldest freed first
  SharedCpuAllocatorStats stats_;
};

// Never destroyed: tensors may be freed after static destructors have run.
SharedCpuAllocator& allocator() {
  static SharedCpuAllocator* a = [] {
    auto* made = new SharedCpuAllocator();
    pthread_atfork([] { allocator().before_fork(); }, [] { allocator().after_fork_parent(); },
                   [] { allocator().after_fork_child(); });
    return made;
  }();
  return *a;
}

void free_block(void* ptr) { allocator().release(ptr); }

}  // namespace

bool shared_block_file(const at::DataPtr& data, SharedBlockFile* out) {
  if (data.get_deleter() != &free_block) return false;
  return allocator().file_of(data.get_context(), out);
}

void install_shared_cpu_allocator(int64_t min_bytes) {
  if (min_bytes != 0 && min_bytes < 4096) {
    throw std::invalid_argument("use_shared_cpu_memory: min_bytes must be at least 4096 (one page), got " +
                                std::to_string(min_bytes));
  }
  allocator().install(min_bytes > 0 ? min_bytes : kSharedMinBytes.get());
}

void uninstall_shared_cpu_allocator() { allocator().uninstall(); }

bool shared_cpu_allocator_installed() { return allocator().enabled(); }

SharedCpuAllocatorStats shared_cpu_allocator_stats() { return allocator().stats(); }

void release_cached_shared_blocks() { allocator().drop_cache(); }

void apply_cpu_allocator_setting() {
  const std::string v = kCpuAllocator.get();
  if (v == "shared") {
    install_shared_cpu_allocator(0);
  } else if (v != "default" && !v.empty()) {
    throw std::invalid_argument("PYCOLL_CPU_ALLOCATOR must be one of: default, shared (got '" + v + "')");
  }
}

}  // namespace pycoll

#include "cpu/kernels/stream_store.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "common/cpu_affinity.h"
#include "common/setting.h"
#include "common/test_hooks.h"

namespace pycoll {

namespace {

constexpr size_t kLeastStreamedBytes = size_t(4)
                                       << 20;  // docs/decisions/0021-streaming-stores-for-large-cpu-outputs.md
// The default threshold's cap, whatever the cache says: inside a VM sysfs reports the socket's
// cache, which other tenants share (300 MiB on the 16-CPU Xeon, where streaming won from 32 MiB
// and lost at 4-16 over 4 ranks; decision 0021).
constexpr size_t kMostDefaultStreamedBytes = size_t(32) << 20;

const IntSetting kStreamStoreMinBytes(
    "PYCOLL_CPU_STREAM_STORE_MIN_BYTES", 0, 0, int64_t(1) << 40, "cpu engine", false, Audience::Developer,
    "Large CPU all_gather and send/recv write the output with streaming (non-temporal) stores from this many "
    "bytes of a rank's output tensor (a receive: the message): 0 = half the last-level cache divided "
    "among the ranks on the host, between 4M and 32M; a size larger than any message (1024G) turns them off. Read once "
    "per group.",
    "0 (auto)", /*bytes=*/true);

// The last-level cache of the first CPU this process may run on (one instance; sockets or core
// complexes can differ), from sysfs: inside a VM sysconf may give the host's instead (320 MiB on
// the 2-core CI machine, whose L3 is 32 MiB). Else sysconf, else 32 MiB.
size_t last_level_cache_bytes() {
  const std::string cpu_dir = "/sys/devices/system/cpu/cpu" + std::to_string(first_allowed_cpu()) + "/cache/";
  for (int index = 4; index >= 2; --index) {
    const std::string dir = cpu_dir + "index" + std::to_string(index) + "/";
    unsigned long kib = 0;
    char unit = 0;
    if (FILE* f = std::fopen((dir + "size").c_str(), "r")) {
      const int got = std::fscanf(f, "%lu%c", &kib, &unit);
      std::fclose(f);
      if (got >= 1 && kib > 0) return static_cast<size_t>(kib) << (unit == 'G' ? 30 : unit == 'M' ? 20 : 10);
    }
  }
#if defined(_SC_LEVEL3_CACHE_SIZE)  // glibc only
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return static_cast<size_t>(l3);
#endif
  return size_t(32) << 20;
}

// stream_copy without the fence.
void stream_unfenced(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // The 16-byte SSE2 form, which every x86-64 has: on the CI machine it streamed 16-64 MiB as fast
  // as 64-byte AVX-512 stores (benchmarks/cpu_stream_stores.c; decision 0021).
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t body = bytes & ~size_t(63);
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + body, s + body, bytes - body);
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Streaming stores are weakly ordered: without the fence the thread or process told "done" by a
// later store (the op's caller, a lane pool's waiter, a receive's waiter) could still read old bytes.
void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace

size_t stream_store_min_bytes(int ranks) {
  if (const int64_t set = kStreamStoreMinBytes.get(); set > 0) return static_cast<size_t>(set);
  static const size_t cache = last_level_cache_bytes();
  // Never below 4 MiB: a 4 MiB copy streamed about as fast as with plain stores on the CI machine,
  // a 1 MiB one slower (decision 0021), whatever the share of the cache a rank has.
  const size_t share = cache / 2 / static_cast<size_t>(std::max(1, ranks));
  return std::clamp(share, kLeastStreamedBytes, kMostDefaultStreamedBytes);
}

void stream_copy(void* dst, const void* src, size_t bytes) {
  stream_unfenced(dst, src, bytes);
  store_fence();
#if defined(__x86_64__)
  test_hooks::count_streamed_bytes(static_cast<int64_t>(bytes));  // elsewhere a plain memcpy: nothing counted
#endif
}

void copy_to_output(bool stream, void* dst, const void* src, size_t bytes) {
  if (stream) {
    stream_copy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

}  // namespace pycoll

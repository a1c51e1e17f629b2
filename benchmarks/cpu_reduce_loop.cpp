/* The CPU engine's reduction loop, alone: one thread summing two float32 operands into a third,
 * in cache (64 KiB-2 MiB per operand) and past it (16 MiB). Three forms:
 *
 *   buffered  the loop before 2026-11-29 (csrc/kernels/cpu_reduce.cpp at 832a0bc): copy a block
 *             of the first operand into an L1 buffer, add the second into it, copy it out;
 *             compiled, as the extension is, without -march (SSE2).
 *   avx2      one pass, out[i] = a[i] + b[i], compiled for AVX2.
 *   avx512    the same for AVX-512 (0 where the CPU has none).
 *
 * The extension now compiles its loops for x86-64-v4, x86-64-v3 and the baseline and picks the
 * CPU's best when it loads (target_clones); docs/algorithms.md, "Reduction loops", has the
 * measurements.
 *
 * Build and run:  g++ -O3 benchmarks/cpu_reduce_loop.cpp -o /tmp/reduce_loop && /tmp/reduce_loop
 */
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

constexpr int64_t kBlock = 2048;

__attribute__((noinline)) void buffered(float* out, const float* a, const float* b, int64_t count) {
  alignas(64) float buf[kBlock];
  for (int64_t base = 0; base < count; base += kBlock) {
    const int64_t n = std::min(kBlock, count - base);
    std::memcpy(buf, a + base, n * sizeof(float));
    for (int64_t i = 0; i < n; ++i) buf[i] = buf[i] + b[base + i];
    std::memcpy(out + base, buf, n * sizeof(float));
  }
}

__attribute__((noinline, target("avx2"))) void avx2(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

__attribute__((noinline, target("avx512f"))) void avx512(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Best of 7 timings of `reps` calls, in microseconds per call.
template <typename F>
double best_us(F f, float* out, const float* a, const float* b, int64_t n, int64_t reps) {
  f(out, a, b, n);
  double best = 1e30;
  for (int k = 0; k < 7; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < reps; ++r) f(out, a, b, n);
    const std::chrono::duration<double, std::micro> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / static_cast<double>(reps));
  }
  return best;
}

int main() {
  const bool has_avx2 = __builtin_cpu_supports("avx2"), has_avx512 = __builtin_cpu_supports("avx512f");
  for (int64_t kib : {64, 256, 2048, 16384}) {
    const int64_t n = kib * 1024 / static_cast<int64_t>(sizeof(float));
    const int64_t reps = std::max<int64_t>(3, 200000 / kib);
    auto* a = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
    auto* b = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
    auto* out = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
    for (int64_t i = 0; i < n; ++i) a[i] = static_cast<float>(i), b[i] = 1.0f, out[i] = 0.0f;
    std::printf("%6ld KiB per operand: buffered %8.1f us  avx2 %8.1f us  avx512 %8.1f us\n", static_cast<long>(kib),
                best_us(buffered, out, a, b, n, reps), has_avx2 ? best_us(avx2, out, a, b, n, reps) : 0.0,
                has_avx512 ? best_us(avx512, out, a, b, n, reps) : 0.0);
    std::free(a), std::free(b), std::free(out);
  }
}

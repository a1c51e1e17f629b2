/* Plain against streaming (non-temporal) stores for the copies and adds a CPU collective does,
 * both processes at once, each pinned to its own CPU: the measurement behind
 * cpu/kernels/stream_store.h (docs/decisions/0021-streaming-stores-for-large-cpu-outputs.md).
 *
 *   copy      memcpy-like loop, 64-byte AVX-512 loads and stores (plain) or streaming stores
 *   copy16    the same with 16-byte SSE2 streaming stores (what the library uses)
 *   add       out = a + b over half the size each, plain or streaming stores
 * Each pass is timed between two barriers, best of REPS, sizes 1, 4, 16 and 64 MiB.
 *
 * Build and run:  cc -O2 -mavx512f benchmarks/cpu_stream_stores.c -o /tmp/stream
 *                 /tmp/stream REPS     (e.g. /tmp/stream 15)
 */
#include "two_process.h" /* first: it defines _GNU_SOURCE */

#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static void copy_plain(float* d, const float* s, size_t n) {
  for (size_t i = 0; i < n; i += 16) _mm512_storeu_ps(d + i, _mm512_loadu_ps(s + i));
}
static void copy_stream(float* d, const float* s, size_t n) {
  for (size_t i = 0; i < n; i += 16) _mm512_stream_ps(d + i, _mm512_loadu_ps(s + i));
  _mm_sfence();
}
static void copy_stream16(float* d, const float* s, size_t n) {
  for (size_t i = 0; i < n; i += 4) _mm_stream_si128((__m128i*)(d + i), _mm_loadu_si128((const __m128i*)(s + i)));
  _mm_sfence();
}
static void add_plain(float* d, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; i += 16) _mm512_storeu_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
}
static void add_stream(float* d, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; i += 16) _mm512_stream_ps(d + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  _mm_sfence();
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? atoi(argv[1]) : 15;
  const int me = fork_pinned();
  const size_t sizes[] = {1 << 20, 4 << 20, 16 << 20, 64 << 20};
  for (int k = 0; k < 4; ++k) {
    const size_t bytes = sizes[k], n = bytes / sizeof(float);
    float* a = aligned_alloc(64, bytes);
    float* b = aligned_alloc(64, bytes);
    float* d = aligned_alloc(64, bytes);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    memset(d, 0, bytes);
    double best[5] = {1e9, 1e9, 1e9, 1e9, 1e9};
    for (int r = 0; r < reps; ++r) {
      for (int mode = 0; mode < 5; ++mode) {
        barrier(me);
        const double t = now();
        switch (mode) {
          case 0: copy_plain(d, a, n); break;
          case 1: copy_stream(d, a, n); break;
          case 2: copy_stream16(d, a, n); break;
          case 3: add_plain(d, a, b, n / 2); break;
          case 4: add_stream(d, a, b, n / 2); break;
        }
        const double us = (now() - t) * 1e6;
        if (us < best[mode]) best[mode] = us;
      }
    }
    barrier(me);
    if (me == 0) {
      printf("%2zu MiB: copy plain %6.0f stream %6.0f stream16 %6.0f | add plain %6.0f stream %6.0f us\n", bytes >> 20,
             best[0], best[1], best[2], best[3], best[4]);
    }
    free(a);
    free(b);
    free(d);
  }
  if (me == 0) wait(NULL);
  return 0;
}

/* What a two-rank reduce_scatter of private buffers costs at the least on this host, against the
 * memory floor pycoll-bench reports for it (each rank adding its two blocks privately, both ranks
 * at once). The measurement behind the CPU engine's limit for reduce_scatter
 * (docs/performance.md, "CPU engine: large messages").
 *
 * Each rank holds IN bytes of input: block 0 (rank 0's output) and block 1 (rank 1's).
 *   floor     both ranks at once: out = in[block me] + in[block peer], both blocks of the rank's
 *             own private input (pycoll-bench's floor: the same bytes touched, nothing crossing).
 *   staged    the least a staged reduce_scatter does, pipelined: per chunk, copy my block for the
 *             peer into my shared slot, publish it, wait for the peer's slot, add my own block and
 *             the peer's slot into the output; a ring of SLOTS slots, so a rank runs ahead.
 *   staged_nt staged, the output written with streaming stores (AVX-512 where built with it).
 *   cma       no staging: read the peer's block in place with process_vm_readv (cross-memory
 *             attach) into a small private scratch, one chunk at a time, then add.
 * The add is one plain C loop in every mode, so the ratios compare the data paths, not the
 * compiler's loop against torch's. Every pass runs between two barriers; best and median of REPS.
 *
 * Build and run:  cc -O3 -march=native benchmarks/cpu_reduce_scatter_ceiling.c -o /tmp/rs_ceiling
 *                 /tmp/rs_ceiling IN_KIB CHUNK_KIB REPS       (e.g. /tmp/rs_ceiling 4096 128 100)
 * On the 2-core CI-class VM (2026-12-04, 128 KiB chunks, three runs), floor / median: staged 0.55-0.61
 * at 1 MiB of input and 0.63-0.66 at 4 MiB, cross-memory attach 0.24-0.28 there; from 16 MiB, out
 * of the cache, staged 0.78-1.03 (docs/performance.md, "CPU engine: large messages").
 */
#include "two_process.h" /* first: it defines _GNU_SOURCE */

#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>

#define SLOTS 4

static void add(float* restrict o, const float* restrict a, const float* restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) o[i] = a[i] + b[i];
}

static void add_nt(float* restrict o, const float* restrict a, const float* restrict b, size_t n) {
#ifdef __AVX512F__
  size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(o + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
  for (; i < n; i++) o[i] = a[i] + b[i];
  _mm_sfence();
#else
  add(o, a, b, n);
#endif
}

static int cmp(const void* x, const void* y) {
  const double a = *(const double*)x, b = *(const double*)y;
  return a < b ? -1 : a > b;
}

int main(int argc, char** argv) {
  if (argc < 4) { fprintf(stderr, "usage: %s IN_KIB CHUNK_KIB REPS\n", argv[0]); return 2; }
  const size_t in_bytes = (size_t)atol(argv[1]) << 10, chunk_bytes = (size_t)atol(argv[2]) << 10;
  const int reps = atoi(argv[3]);
  const size_t m = in_bytes / 2 / sizeof(float), chunk = chunk_bytes / sizeof(float);
  /* slot[r][s]: rank r's slot s; step counters: staged[r], consumed[r] */
  float* slots = mmap(0, 2 * SLOTS * chunk_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  counter* ctr = mmap(0, 4 * sizeof(counter), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  pid_t* pids = mmap(0, 2 * sizeof(pid_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  float** ins = mmap(0, 2 * sizeof(float*), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(slots, 0, 2 * SLOTS * chunk_bytes);
  const int me = fork_pinned(), peer = 1 - me;
  float* in = aligned_alloc(64, in_bytes);
  float* out = aligned_alloc(64, in_bytes / 2);
  float* scratch = aligned_alloc(64, chunk_bytes);
  for (size_t i = 0; i < 2 * m; i++) in[i] = (float)(i % 7 + me);
  memset(out, 0, in_bytes / 2);
  pids[me] = getpid();
  ins[me] = in;
  barrier(me);
  counter* staged = ctr;
  counter* consumed = ctr + 2;
  long step = 0; /* identical on both ranks */
  const char* names[] = {"floor", "staged", "staged_nt", "cma"};
  double floor_median = 0;
  double* t = malloc(reps * sizeof(double));
  for (int mode = 0; mode < 4; ++mode) {
    for (int r = 0; r < reps; ++r) {
      barrier(me);
      const double t0 = now();
      if (mode == 0) {
        add(out, in + me * m, in + peer * m, m);
      } else {
        for (size_t at = 0; at < m; at += chunk) {
          const size_t len = m - at < chunk ? m - at : chunk;
          if (mode == 3) {
            struct iovec local = {scratch, len * sizeof(float)};
            struct iovec remote = {ins[peer] + me * m + at, len * sizeof(float)};
            if (process_vm_readv(pids[peer], &local, 1, &remote, 1, 0) != (ssize_t)(len * sizeof(float))) {
              perror("process_vm_readv");
              return 1;
            }
            add(out + at, in + me * m + at, scratch, len);
            continue;
          }
          const long g = step++;
          float* mine = slots + ((size_t)me * SLOTS + g % SLOTS) * chunk;
          const float* theirs = slots + ((size_t)peer * SLOTS + g % SLOTS) * chunk;
          if (g >= SLOTS) /* the peer has read my slot for step g - SLOTS */
            while (atomic_load_explicit(&consumed[peer].v, memory_order_acquire) < g - SLOTS + 1) {}
          memcpy(mine, in + peer * m + at, len * sizeof(float));
          atomic_store_explicit(&staged[me].v, g + 1, memory_order_release);
          while (atomic_load_explicit(&staged[peer].v, memory_order_acquire) < g + 1) {}
          (mode == 2 ? add_nt : add)(out + at, in + me * m + at, theirs, len);
          atomic_store_explicit(&consumed[me].v, g + 1, memory_order_release);
        }
      }
      barrier(me);
      t[r] = now() - t0;
    }
    qsort(t, reps, sizeof(double), cmp);
    const double median = t[reps / 2];
    if (mode == 0) floor_median = median;
    if (me == 0)
      printf("%-9s %6zu KiB in  best %8.1f us  median %8.1f us  floor/median %.2f\n", names[mode], in_bytes >> 10,
             t[0] * 1e6, median * 1e6, floor_median / median);
  }
  if (me == 0) wait(0);
  return 0;
}

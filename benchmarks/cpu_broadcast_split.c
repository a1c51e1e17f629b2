/* What a two-process broadcast over shared memory costs when only the reader copies (the root
 * waits) against the root writing half of the message into the reader's buffer while the reader
 * copies the other half: the measurement behind shared_broadcast's split
 * (csrc/cpu/shared_storage.h; docs/algorithms.md, "Tensors in shared memory").
 *
 *   floor            both ranks at once: one private memcpy of the message (pycoll-bench's floor).
 *   pull             the reader copies the root's shared buffer into its own shared buffer.
 *   split            the root copies the first half into the reader's buffer, the reader the second.
 *   split-after-write  split, with the reader having written its whole buffer just before (its
 *                    lines are modified in its own cache when the root writes into them).
 *   split-after-read   split, with the reader having read its whole buffer just before (the data
 *                    used after the previous broadcast).
 * Every pass is timed between two barriers; best and median of REPS; both pinned to their own CPU.
 *
 * Build and run:  cc -O3 -march=native benchmarks/cpu_broadcast_split.c -o /tmp/split
 *                 /tmp/split KIB REPS     (e.g. /tmp/split 1024 300)
 */
#include "two_process.h"  /* first: it defines _GNU_SOURCE */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s KIB REPS\n", argv[0]); return 2; }
  const size_t n = (size_t)atol(argv[1]) << 10;
  const int reps = atoi(argv[2]);
  char* root_buf = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  char* reader_buf = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(root_buf, 1, n);
  memset(reader_buf, 0, n);
  const int me = fork_pinned();  /* 0: the root, 1: the reader */
  char* in = malloc(n);
  char* out = malloc(n);
  memset(in, 2, n);
  memset(out, 0, n);
  double* t = malloc(sizeof(double) * reps);
  volatile long sink = 0;
  const char* names[] = {"floor", "pull", "split", "split-after-write", "split-after-read"};
  for (int mode = 0; mode < 5; ++mode) {
    for (int r = 0; r < reps; ++r) {
      if (me == 1 && mode == 3) memset(reader_buf, r, n);
      if (me == 1 && mode == 4) {
        long s = 0;
        for (size_t i = 0; i < n; i += 64) s += reader_buf[i];
        sink += s;
      }
      barrier(me);
      const double t0 = now();
      if (mode == 0) {
        memcpy(out, in, n);
      } else if (mode == 1) {
        if (me == 1) memcpy(reader_buf, root_buf, n);
      } else if (me == 0) {
        memcpy(reader_buf, root_buf, n / 2);
      } else {
        memcpy(reader_buf + n / 2, root_buf + n / 2, n - n / 2);
      }
      barrier(me);
      t[r] = now() - t0;
    }
    qsort(t, reps, sizeof(double), by_value);
    if (me == 0) printf("%6zu KiB %-18s best %7.1f us  median %7.1f us\n", n >> 10, names[mode], t[0] * 1e6, t[reps / 2] * 1e6);
    barrier(me);
  }
  return 0;
}

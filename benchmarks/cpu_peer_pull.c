/* What an all_gather between two processes costs at the least when the data must cross from one
 * core to the other, against the memory floor pycoll-bench reports (each rank copying its output's
 * bytes privately, both at once). The measurement behind the CPU engine's limit at 1-4 MiB
 * (docs/performance.md, "CPU engine: large messages").
 *
 *   floor   both ranks at once: one memcpy of 2 x MIB from a private buffer to a private buffer
 *           (what pycoll-bench's floor row does for an all_gather of MIB per rank).
 *   local   both ranks at once: memcpy MIB into shared memory, then the same MIB back out of it
 *           (the staging copies without any crossing).
 *   pull    both ranks at once: memcpy MIB into its own shared block, barrier, then memcpy the
 *           peer's block (written by the other core just before) into a private buffer.
 *   gather  pull plus the own block copied to the output: the least a staged all_gather does.
 * Every pass is timed between two barriers, best of REPS; both ranks pinned to their own CPU.
 *
 * Build and run:  cc -O3 -march=native benchmarks/cpu_peer_pull.c -o /tmp/pull
 *                 /tmp/pull MIB_PER_RANK_IN_KIB REPS     (e.g. /tmp/pull 1024 200)
 */
#include "two_process.h"  /* first: it defines _GNU_SOURCE */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s KIB_PER_RANK REPS\n", argv[0]); return 2; }
  const size_t n = (size_t)atol(argv[1]) << 10;
  const int reps = atoi(argv[2]);
  char* shm = mmap(0, 2 * n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(shm, 1, 2 * n);
  const int me = fork_pinned();
  char* in = malloc(2 * n);
  char* out = malloc(2 * n);
  memset(in, 2 + me, 2 * n);
  memset(out, 0, 2 * n);
  const char* names[] = {"floor", "local", "pull", "gather"};
  for (int mode = 0; mode < 4; ++mode) {
    double best = 1e9;
    for (int r = 0; r < reps; ++r) {
      barrier(me);
      const double t0 = now();
      if (mode == 0) {
        memcpy(out, in, 2 * n);
      } else {
        memcpy(shm + me * n, in, n);
        if (mode == 1) {
          memcpy(out + me * n, shm + me * n, n);
        } else {
          barrier(me);
          memcpy(out + (1 - me) * n, shm + (1 - me) * n, n);
          if (mode == 3) memcpy(out + me * n, in, n);
        }
      }
      barrier(me);
      const double t = now() - t0;
      if (t < best) best = t;
    }
    if (me == 0) printf("%-7s %8.1f us  (%zu KiB per rank)\n", names[mode], best * 1e6, n >> 10);
  }
  if (me == 0) wait(0);
  return 0;
}

/* The measurement behind reading shared-memory tensors in place (csrc/algorithms/shared_storage.h):
 * two processes, one core each, each reduces its half of a reduce_scatter straight from both
 * ranks' inputs, which live in shared memory (as after tensor.share_memory_()), against the floor:
 * the same add over two private blocks, both ranks at once.
 *
 * Build and run:  cc -O3 -march=x86-64-v3 benchmarks/cpu_shared_reduce.c -o /tmp/shared_reduce
 *                 for m in 1 4 16 64; do /tmp/shared_reduce $m; done     (MiB of input per rank)
 * On the 2-core CI machine (2026-11-29), means of 30 rounds, floor / in place: 1.01, 1.00, 1.03
 * and 0.97 at 1, 4, 16 and 64 MiB: reading the peer's shared input in place runs at the floor.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 30

typedef struct { _Atomic long v; char pad[56]; } counter;
static counter* arrive;  /* one per rank, in shared memory */
static int me;
static long epoch;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void barrier(void) {
  atomic_store_explicit(&arrive[me].v, ++epoch, memory_order_release);
  int spins = 0;
  while (atomic_load_explicit(&arrive[1 - me].v, memory_order_acquire) < epoch) {
    if (++spins > 1000) sched_yield();
  }
}

static void add(float* restrict o, const float* restrict a, const float* restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) o[i] = a[i] + b[i];
}

/* Both ranks run fn at once; returns this rank's time. */
static double timed(void (*fn)(void*), void* arg) {
  barrier();
  double t = now();
  fn(arg);
  barrier();
  return now() - t;
}

typedef struct { float *out; const float *a, *b; size_t n; } add_args;
static void run_add(void* p) { add_args* x = p; add(x->out, x->a, x->b, x->n); }

int main(int argc, char** argv) {
  if (argc != 2) { fprintf(stderr, "usage: %s MIB\n", argv[0]); return 2; }
  const size_t mib = strtoul(argv[1], NULL, 10), bytes = mib << 20, n = bytes / 4, half = n / 2;
  arrive = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  float* input[2];  /* each rank's reduce_scatter input, in shared memory */
  for (int r = 0; r < 2; r++) input[r] = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  const pid_t child = fork();
  me = child == 0 ? 1 : 0;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  CPU_SET(me, &cpus);
  sched_setaffinity(0, sizeof cpus, &cpus);
  for (size_t i = 0; i < n; i++) input[me][i] = i * 0.5f + me;
  float *private_a = malloc(bytes / 2), *private_b = malloc(bytes / 2), *out = malloc(bytes / 2);
  memset(private_a, 1, bytes / 2);
  memset(private_b, 2, bytes / 2);
  memset(out, 0, bytes / 2);
  /* Rank r reduces half r: its own input's and the peer's, read in place. */
  add_args floor_args = {out, private_a, private_b, half};
  add_args in_place_args = {out, input[me] + me * half, input[1 - me] + me * half, half};
  for (int i = 0; i < 5; i++) { timed(run_add, &floor_args); timed(run_add, &in_place_args); }
  double floor_sum = 0, in_place_sum = 0;
  for (int i = 0; i < ROUNDS; i++) {
    floor_sum += timed(run_add, &floor_args);
    in_place_sum += timed(run_add, &in_place_args);
  }
  if (me == 0) {
    printf("%zu MiB: floor %.1f us, in place %.1f us (means of %d rounds): floor / in place %.2f\n", mib,
           floor_sum / ROUNDS * 1e6, in_place_sum / ROUNDS * 1e6, ROUNDS, floor_sum / in_place_sum);
  }
  if (child) wait(NULL);
  return 0;
}

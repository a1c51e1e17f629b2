/* What the two-process C models (cpu_peer_pull.c, cpu_reduce_scatter_ceiling.c, cpu_broadcast_split.c,
 * cpu_stream_stores.c) share: two processes forked from one, each pinned to its own CPU, meeting at
 * a spinning barrier in shared memory.
 * A header only, so each model still builds with one cc command. */
#ifndef PYCOLL_BENCH_TWO_PROCESS_H
#define PYCOLL_BENCH_TWO_PROCESS_H

#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct { _Atomic long v; char pad[56]; } counter;
static counter* arrivals; /* one arrival counter per process, in shared memory */
static long generation;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

/* Forks; returns 0 in the parent and 1 in the child, each pinned to that CPU. Memory mapped
 * MAP_SHARED before the call is shared by both. */
static int fork_pinned(void) {
  arrivals = mmap(0, 2 * sizeof(counter), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  const int me = fork() == 0 ? 1 : 0;
  cpu_set_t cs;
  CPU_ZERO(&cs);
  CPU_SET(me, &cs);
  sched_setaffinity(0, sizeof cs, &cs);
  return me;
}

static void barrier(int me) {
  ++generation;
  atomic_store_explicit(&arrivals[me].v, generation, memory_order_release);
  while (atomic_load_explicit(&arrivals[1 - me].v, memory_order_acquire) < generation) {}
}

#endif

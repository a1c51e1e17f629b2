// Polling a condition for a short while before a thread goes to sleep on a condition variable.
//
// Waking a sleeping thread costs a futex call and, on a virtual machine whose other core is idle,
// tens of microseconds before that core runs again. Polling catches the common case, a hand-off
// that completes within microseconds, with no wake-up at all. It pays only where the poller has a
// CPU of its own: with ranks on as many cores as ranks, a poller takes the core from the very
// thread it waits for. docs/decisions/0018-cpu-ops-poll-before-sleep.md
#pragma once

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace pycoll {

// One pause of a spin loop: the core's hint that this thread waits (and its sibling may run).
inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// True once `ready()` holds, false if `budget` passed first (the caller then sleeps as before).
template <typename Ready>
bool spin_briefly(Ready&& ready, std::chrono::microseconds budget) {
  if (budget.count() <= 0) return ready();
  const auto until = std::chrono::steady_clock::now() + budget;
  do {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_pause();
    }
  } while (std::chrono::steady_clock::now() < until);
  return ready();
}

}  // namespace pycoll

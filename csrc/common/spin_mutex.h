// A lock for critical sections of a few instructions that two threads take in bursts (a pool's
// free list, filled by a background thread while the issuing thread takes from it). A contended
// std::mutex puts the waiter to sleep in a futex call, microseconds to wake, for a holder that
// would have let go within nanoseconds; this one spins, and yields the core only after a while,
// so that it cannot starve a holder that shares the core.
#pragma once

#include <atomic>
#include <thread>

#include "common/brief_spin.h"

namespace pycoll {

class SpinMutex {
 public:
  void lock() {
    for (int spins = 0;; ++spins) {
      if (!held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire)) return;
      if (spins < 256) {
        cpu_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }
  void unlock() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

}  // namespace pycoll

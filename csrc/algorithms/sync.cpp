#include "algorithms/sync.h"

#include <sched.h>
#include <thread>

#include "common/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PYCOLL_CPU_RELAX() _mm_pause()
#else
#define PYCOLL_CPU_RELAX() ((void)0)
#endif

namespace pycoll {

void Waiter::fail(int peer, const char* stage, bool dead) {
  if (dead) {
    throw GroupBroken(str(what_, ": rank ", peer, " exited while this rank waited for it (", stage, ")"));
  }
  if (abort_ && abort_->load()) {
    throw GroupBroken(str(what_, ": aborted while waiting for rank ", peer, " (", stage, ")"));
  }
  // " timeout " and "timed out": what torch's tests and users' log searches look for.
  throw GroupBroken(str(what_, ": timed out waiting for rank ", peer, " (", stage, ") past the group's timeout (",
                        timeout_.count(), " ms); the peer may have crashed, hung, or called a different collective"));
}

void Waiter::until_ge(int peer, const std::atomic<uint64_t>& counter, uint64_t target, const char* stage) {
  if (counter.load(std::memory_order_acquire) >= target) return;
  for (int i = 0; i < 256; ++i) {
    PYCOLL_CPU_RELAX();
    if (counter.load(std::memory_order_acquire) >= target) return;
  }
  auto last_check = Clock::now();
  uint64_t rounds = 0;
  while (counter.load(std::memory_order_acquire) < target) {
    ++rounds;
    if (rounds < 2000) {
      sched_yield();
    } else {
      // Long waits (a peer still computing) should not burn a core.
      std::this_thread::sleep_for(std::chrono::microseconds(rounds < 20000 ? 20 : 200));
    }
    if ((rounds & 63) == 0 || rounds >= 2000) {
      auto now = Clock::now();
      if (abort_ && abort_->load()) fail(peer, stage, false);
      if (now > deadline_) fail(peer, stage, !t_.peer_alive(peer));
      if (now - last_check > std::chrono::milliseconds(50)) {
        last_check = now;
        if (counter.load(std::memory_order_acquire) >= target) return;
        if (!t_.peer_alive(peer)) fail(peer, stage, true);
      }
    }
  }
}

void Waiter::until_ge_napping(int peer, const std::atomic<uint64_t>& counter, uint64_t target, const char* stage,
                              std::chrono::microseconds nap) {
  auto last_check = Clock::now();
  while (counter.load(std::memory_order_acquire) < target) {
    std::this_thread::sleep_for(nap);
    const auto now = Clock::now();
    if (abort_ && abort_->load()) fail(peer, stage, false);
    if (now > deadline_) fail(peer, stage, !t_.peer_alive(peer));
    if (now - last_check > std::chrono::milliseconds(50)) {
      last_check = now;
      if (counter.load(std::memory_order_acquire) >= target) return;
      if (!t_.peer_alive(peer)) fail(peer, stage, true);
    }
  }
}

void Waiter::barrier(uint64_t& epoch) {
  ++epoch;
  const int me = t_.rank();
  t_.control(me).arrive.value.store(epoch, std::memory_order_release);
  for (int r = 0; r < t_.size(); ++r) {
    if (r != me) until_ge(r, t_.control(r).arrive.value, epoch, "barrier");
  }
}

}  // namespace pycoll

#include "cpu/sync.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <thread>

#include "common/check.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PYCOLL_CPU_RELAX() _mm_pause()
#else
#define PYCOLL_CPU_RELAX() ((void)0)
#endif

namespace pycoll {

Waiter::Clock::time_point Waiter::deadline() {
  Clock::rep d = deadline_.load(std::memory_order_relaxed);
  if (d == 0) {
    const Clock::rep mine = (Clock::now() + timeout_).time_since_epoch().count();
    // The first lane to get here sets it; the others take the value it set.
    d = deadline_.compare_exchange_strong(d, mine, std::memory_order_relaxed) ? mine : d;
  }
  return Clock::time_point(Clock::duration(d));
}

void Waiter::fail(int peer, const char* stage, bool dead) {
  const std::string what = op_ != nullptr ? str("pycoll::", op_, " (op #", seq_, ")") : what_;
  if (dead) {
    throw GroupBroken(str(what, ": rank ", peer, " exited while this rank waited for it (", stage, ")"));
  }
  if (abort_ && abort_->load()) {
    throw GroupBroken(str(what, ": aborted while waiting for rank ", peer, " (", stage, ")"));
  }
  // " timeout " and "timed out": what torch's tests and users' log searches look for.
  throw GroupBroken(str(what, ": timed out waiting for rank ", peer, " (", stage, ") past the group's timeout (",
                        timeout_.count(), " ms); the peer may have crashed, hung, or called a different collective"));
}

void Waiter::until_ge(int peer, const std::atomic<uint64_t>& counter, uint64_t target, const char* stage) {
  if (counter.load(std::memory_order_acquire) >= target) return;
  for (int i = 0; i < 256; ++i) {
    PYCOLL_CPU_RELAX();
    if (counter.load(std::memory_order_acquire) >= target) return;
  }
  auto last_check = Clock::now();
  const Clock::time_point until = deadline();
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
      if (now > until) fail(peer, stage, !t_.peer_alive(peer));
      if (now - last_check > std::chrono::milliseconds(50)) {
        last_check = now;
        if (counter.load(std::memory_order_acquire) >= target) return;
        if (!t_.peer_alive(peer)) fail(peer, stage, true);
      }
    }
  }
}

namespace {
// The counter's low 32 bits, the word a futex watches (x86 and arm64 are little-endian). A
// counter that only grows changes those bits at every store of a waiter's interest for 2^32 stores.
uint32_t* futex_word(std::atomic<uint64_t>& counter) {
  static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t), "a lock-free 64-bit atomic");
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the low 32 bits come first");
  return reinterpret_cast<uint32_t*>(&counter);
}
}  // namespace

void Waiter::until_ge_asleep(int peer, std::atomic<uint64_t>& counter, uint64_t target, const char* stage) {
  for (;;) {
    const uint64_t seen = counter.load(std::memory_order_acquire);
    if (seen >= target) return;
    // Not FUTEX_PRIVATE: the waker is another process. The kernel sleeps only if the word still
    // holds what we saw, so a store and wake between our load and this call cannot be missed.
    struct timespec nap{0, 20 * 1000 * 1000};
    if (syscall(SYS_futex, futex_word(counter), FUTEX_WAIT, static_cast<uint32_t>(seen), &nap, nullptr, 0) != 0 &&
        errno != EAGAIN && errno != EINTR && errno != ETIMEDOUT) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));  // no futex here (seccomp, say): poll
    }
    if (counter.load(std::memory_order_acquire) >= target) return;
    if (abort_ && abort_->load()) fail(peer, stage, false);
    if (Clock::now() > deadline()) fail(peer, stage, !t_.peer_alive(peer));
    if (!t_.peer_alive(peer)) fail(peer, stage, true);
  }
}

void wake_sleepers(std::atomic<uint64_t>& counter) {
  syscall(SYS_futex, futex_word(counter), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
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

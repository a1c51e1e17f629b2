// Waiting on peers' counters, and the group barrier built from them.
//
// Every wait is bounded: it spins briefly (peers usually arrive within
// microseconds), then yields, then sleeps, and throws once the op's deadline
// passes or the peer's process is gone. Yielding matters: tests run 4 ranks on
// 2 cores, where pure spinning starves the rank we are waiting for.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "transport/transport.h"

namespace pycoll {

class Waiter {
 public:
  using Clock = std::chrono::steady_clock;
  Waiter(Transport& t, std::chrono::milliseconds timeout, const std::atomic<bool>* abort, std::string what)
      : t_(t), timeout_(timeout), deadline_(Clock::now() + timeout), abort_(abort), what_(std::move(what)) {}

  // Returns once counter >= target (acquire). `peer` owns the counter.
  void until_ge(int peer, const std::atomic<uint64_t>& counter, uint64_t target, const char* stage);
  // The same for a wait known to take long (the peer copies a large message meanwhile): sleeps
  // `nap` between looks from the start, leaving the CPU to the ranks doing the work, instead of
  // spinning and yielding first.
  void until_ge_napping(int peer, const std::atomic<uint64_t>& counter, uint64_t target, const char* stage,
                        std::chrono::microseconds nap);

  // All ranks arrive, then all leave: release my epoch, acquire every peer's.
  void barrier(uint64_t& epoch);

  Transport& transport() { return t_; }

 private:
  [[noreturn]] void fail(int peer, const char* stage, bool dead);
  Transport& t_;
  std::chrono::milliseconds timeout_;
  Clock::time_point deadline_;
  const std::atomic<bool>* abort_;
  std::string what_;
};

}  // namespace pycoll

// Waiting on peers' counters, and the group barrier built from them.
//
// Every wait is bounded: it spins briefly (peers usually arrive within
// microseconds), then yields, then sleeps, and throws once the op's deadline
// passes or the peer's process is gone. The deadline is the group's timeout from
// the op's first wait that outlasts the spin (an op whose peers are there reads
// no clock). Yielding matters: tests run 4 ranks on
// 2 cores, where pure spinning starves the rank we are waiting for.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "transport/transport.h"

namespace pycoll {

class Waiter {
 public:
  using Clock = std::chrono::steady_clock;
  // A collective's waits: `op` names it in errors (a string literal), `seq` is its number in the
  // group; the message is made only for an error.
  Waiter(Transport& t, std::chrono::milliseconds timeout, const std::atomic<bool>* abort, const char* op, uint64_t seq)
      : t_(t), timeout_(timeout), abort_(abort), op_(op), seq_(seq) {}
  // Other waits, named by `what` ("pycoll::send to rank 1").
  Waiter(Transport& t, std::chrono::milliseconds timeout, const std::atomic<bool>* abort, std::string what)
      : t_(t), timeout_(timeout), abort_(abort), what_(std::move(what)) {}

  // Returns once counter >= target (acquire). `peer` owns the counter.
  void until_ge(int peer, const std::atomic<uint64_t>& counter, uint64_t target, const char* stage);
  // The same for a wait known to take long (the peer copies a large message meanwhile): sleeps in
  // the kernel from the start, leaving the CPU to the ranks doing the work, until the peer's
  // wake_sleepers(counter) after its store (or every 20 ms, to check the deadline and the peer).
  // The counter must live in memory shared between the processes (a futex on its low 32 bits).
  void until_ge_asleep(int peer, std::atomic<uint64_t>& counter, uint64_t target, const char* stage);

  // All ranks arrive, then all leave: release my epoch, acquire every peer's.
  void barrier(uint64_t& epoch);

  Transport& transport() { return t_; }

 private:
  [[noreturn]] void fail(int peer, const char* stage, bool dead);
  Clock::time_point deadline();  // set by the first call (of any lane's thread)
  Transport& t_;
  std::chrono::milliseconds timeout_;
  // Ticks of Clock; 0: no wait has outlasted its spin yet. Atomic: a pipelined op's lanes share
  // their op's Waiter.
  std::atomic<Clock::rep> deadline_{0};
  const std::atomic<bool>* abort_;
  const char* op_ = nullptr;
  uint64_t seq_ = 0;
  std::string what_;  // where op_ is null
};

// Wakes every thread of any process in until_ge_asleep on `counter`; call it after the store
// (release) that those threads wait for.
void wake_sleepers(std::atomic<uint64_t>& counter);

}  // namespace pycoll

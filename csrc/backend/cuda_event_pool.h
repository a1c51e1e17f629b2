// CUDA events reused across collectives. Creating and destroying an event
// costs about a microsecond each; an async collective needs two (one to
// order its comm stream after the caller's stream, one for wait()/query()),
// so at small sizes fresh events were a visible share of the call
// (ProcessGroupNCCL keeps an event cache for the same reason).
//
// A handle is counted by hand rather than a std::shared_ptr: a shared_ptr with a deleter
// allocates its count on every get(). Events mostly go back from another thread (the flight
// recorder's watcher returns hundreds a millisecond while ops take new ones), so the pool keeps
// two lists under two locks: the takers' list, which get() pops with no cache line shared with
// the returning thread, and the returned list, which a taker swaps in whole when its own runs
// dry. A handle's node is made once per event and goes back to the pool with it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace pycoll {

class EventPool {
  struct Free;
  struct Node;

 public:
  // An event of the pool; it returns to the pool when the last copy of the handle goes away,
  // even after the pool itself is gone (the event is destroyed then).
  class Event {
   public:
    Event() = default;
    Event(std::nullptr_t) {}  // NOLINT: like a null pointer, `cond ? pool.get() : nullptr`
    Event(const Event& other);
    Event(Event&& other) noexcept : node_(other.node_) { other.node_ = nullptr; }
    Event& operator=(Event other) noexcept;
    ~Event();
    cudaEvent_t get() const;
    explicit operator bool() const { return node_ != nullptr; }

   private:
    friend class EventPool;
    explicit Event(Node* node) : node_(node) {}
    Node* node_ = nullptr;
  };

  // Events of `device`, created without timing (cheaper to record) unless the pool is `timed`.
  explicit EventPool(int device, bool timed = false);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  Event get();

 private:
  Free* free_;  // outlives the pool while events are out: the last one returned deletes it
};

}  // namespace pycoll

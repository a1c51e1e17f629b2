// CUDA events reused across collectives. Creating and destroying an event
// costs about a microsecond each; an async collective needs two (one to
// order its comm stream after the caller's stream, one for wait()/query()),
// so at small sizes fresh events were a visible share of the call
// (ProcessGroupNCCL keeps an event cache for the same reason).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

namespace pycoll {

class EventPool {
 public:
  // An event of `device`, created without timing (cheaper to record) unless the pool is
  // `timed`; it returns to the pool when the last copy of the handle goes away, even after the
  // pool itself is gone.
  using Event = std::shared_ptr<CUevent_st>;

  explicit EventPool(int device, bool timed = false);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  Event get();

 private:
  struct Free;
  std::shared_ptr<Free> free_;
};

}  // namespace pycoll

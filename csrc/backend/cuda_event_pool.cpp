#include "backend/cuda_event_pool.h"

#include <c10/cuda/CUDAGuard.h>
#include "common/cuda_check.h"

namespace pycoll {

struct EventPool::Free {
  int device;
  bool timed = false;
  bool closed = false;  // the pool is gone: returned events are destroyed instead
  std::mutex mu;
  std::vector<cudaEvent_t> events;
};

EventPool::EventPool(int device, bool timed) : free_(std::make_shared<Free>()) {
  free_->device = device;
  free_->timed = timed;
}

EventPool::~EventPool() {
  std::vector<cudaEvent_t> events;
  {
    std::lock_guard<std::mutex> g(free_->mu);
    free_->closed = true;
    events.swap(free_->events);
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(free_->device));
  // At interpreter exit the CUDA context may already be gone; nothing to report then.
  for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
}

EventPool::Event EventPool::get() {
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> g(free_->mu);
    if (!free_->events.empty()) {
      e = free_->events.back();
      free_->events.pop_back();
    }
  }
  if (e == nullptr) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(free_->device));
    PYCOLL_CUDA_CHECK(cudaEventCreateWithFlags(&e, free_->timed ? cudaEventDefault : cudaEventDisableTiming),
                      "pycoll: cudaEventCreateWithFlags");
  }
  std::shared_ptr<Free> free = free_;
  return Event(e, [free](cudaEvent_t ev) {
    std::lock_guard<std::mutex> g(free->mu);
    if (free->closed) {
      (void)cudaEventDestroy(ev);
    } else {
      free->events.push_back(ev);
    }
  });
}

}  // namespace pycoll

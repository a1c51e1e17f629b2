#include "backend/cuda_event_pool.h"

#include <c10/cuda/CUDAGuard.h>

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "common/cuda_check.h"
#include "common/spin_mutex.h"

namespace pycoll {

struct EventPool::Free {
  int device = 0;
  bool timed = false;
  bool closed = false;  // the pool is gone: returned events are destroyed instead
  // A watcher thread returns a burst of events while ops take new ones: a spin, not a sleep.
  SpinMutex mu;
  std::vector<Node*> nodes;
};

struct EventPool::Node {
  cudaEvent_t event = nullptr;
  std::atomic<int> refs{0};
  std::shared_ptr<Free> free;  // set while handed out: the pool's list outlives its handles
};

EventPool::Event::Event(const Event& other) : node_(other.node_) {
  if (node_) node_->refs.fetch_add(1, std::memory_order_relaxed);
}

EventPool::Event& EventPool::Event::operator=(Event other) noexcept {
  std::swap(node_, other.node_);
  return *this;
}

cudaEvent_t EventPool::Event::get() const { return node_ ? node_->event : nullptr; }

EventPool::Event::~Event() {
  if (!node_ || node_->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::shared_ptr<Free> free = std::move(node_->free);
  {
    std::lock_guard<SpinMutex> g(free->mu);
    if (!free->closed) {
      free->nodes.push_back(node_);
      return;
    }
  }
  (void)cudaEventDestroy(node_->event);  // at interpreter exit the context may be gone: nothing to report
  delete node_;
}

EventPool::EventPool(int device, bool timed) : free_(std::make_shared<Free>()) {
  free_->device = device;
  free_->timed = timed;
}

EventPool::~EventPool() {
  std::vector<Node*> nodes;
  {
    std::lock_guard<SpinMutex> g(free_->mu);
    free_->closed = true;
    nodes.swap(free_->nodes);
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(free_->device));
  // At interpreter exit the CUDA context may already be gone; nothing to report then.
  for (Node* n : nodes) {
    (void)cudaEventDestroy(n->event);
    delete n;
  }
}

EventPool::Event EventPool::get() {
  Node* node = nullptr;
  {
    std::lock_guard<SpinMutex> g(free_->mu);
    if (!free_->nodes.empty()) {
      node = free_->nodes.back();
      free_->nodes.pop_back();
    }
  }
  if (node == nullptr) {
    cudaEvent_t e = nullptr;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(free_->device));
    PYCOLL_CUDA_CHECK(cudaEventCreateWithFlags(&e, free_->timed ? cudaEventDefault : cudaEventDisableTiming),
                      "pycoll: cudaEventCreateWithFlags");
    node = new Node;
    node->event = e;
  }
  node->refs.store(1, std::memory_order_relaxed);
  node->free = free_;
  return Event(node);
}

}  // namespace pycoll

#include "backend/cuda_event_pool.h"

#include <c10/cuda/CUDAGuard.h>

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "common/cuda_check.h"
#include "common/spin_mutex.h"

namespace pycoll {

// Lock order: take_mu, then give_mu. Each list on cache lines of its own.
struct EventPool::Free {
  int device = 0;
  bool timed = false;
  alignas(64) SpinMutex take_mu;  // spins: a holder keeps it for a few instructions
  std::vector<Node*> taking;      // get() pops these
  size_t made = 0;                // nodes made, under take_mu
  alignas(64) SpinMutex give_mu;
  std::vector<Node*> given;       // returned events
  bool closed = false;            // the pool is gone: returned events are destroyed instead
  size_t out_at_close = 0;        // events still out when the pool went; the last one deletes this
};

struct EventPool::Node {
  cudaEvent_t event = nullptr;
  std::atomic<int> refs{0};
  Free* free = nullptr;
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
  Free* free = node_->free;
  bool last = false;
  {
    std::lock_guard<SpinMutex> g(free->give_mu);
    if (!free->closed) {
      free->given.push_back(node_);
      return;
    }
    last = --free->out_at_close == 0;
  }
  (void)cudaEventDestroy(node_->event);  // at interpreter exit the context may be gone: nothing to report
  delete node_;
  if (last) delete free;
}

EventPool::EventPool(int device, bool timed) : free_(new Free) {
  free_->device = device;
  free_->timed = timed;
}

EventPool::~EventPool() {
  std::vector<Node*> nodes;
  bool none_out = false;
  {
    std::lock_guard<SpinMutex> t(free_->take_mu);
    std::lock_guard<SpinMutex> g(free_->give_mu);
    free_->closed = true;
    nodes.swap(free_->taking);
    nodes.insert(nodes.end(), free_->given.begin(), free_->given.end());
    free_->given.clear();
    free_->out_at_close = free_->made - nodes.size();
    none_out = free_->out_at_close == 0;
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(free_->device));
  // At interpreter exit the CUDA context may already be gone; nothing to report then.
  for (Node* n : nodes) {
    (void)cudaEventDestroy(n->event);
    delete n;
  }
  if (none_out) delete free_;
}

EventPool::Event EventPool::get() {
  Node* node = nullptr;
  {
    std::lock_guard<SpinMutex> t(free_->take_mu);
    if (free_->taking.empty()) {
      std::lock_guard<SpinMutex> g(free_->give_mu);
      free_->taking.swap(free_->given);
    }
    if (!free_->taking.empty()) {
      node = free_->taking.back();
      free_->taking.pop_back();
    } else {
      ++free_->made;  // counted before the event exists: a failed create is not out
    }
  }
  if (node == nullptr) {
    cudaEvent_t e = nullptr;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(free_->device));
    const cudaError_t err =
        cudaEventCreateWithFlags(&e, free_->timed ? cudaEventDefault : cudaEventDisableTiming);
    if (err != cudaSuccess) {
      std::lock_guard<SpinMutex> t(free_->take_mu);
      --free_->made;
    }
    PYCOLL_CUDA_CHECK(err, "pycoll: cudaEventCreateWithFlags");
    node = new Node;
    node->event = e;
    node->free = free_;
  }
  node->refs.store(1, std::memory_order_relaxed);
  return Event(node);
}

}  // namespace pycoll

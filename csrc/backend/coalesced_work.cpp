#include "backend/coalesced_work.h"

#include <ATen/core/jit_type.h>

#include <algorithm>
#include <memory>

namespace pycoll {

CoalescedWork::CoalescedWork(int rank, uint64_t seq)
    // No profiling title: its members record their own events (one of them the batch's launch).
    : c10d::Work(rank, c10d::OpType::COALESCED), seq_(seq) {}

void CoalescedWork::add(c10::intrusive_ptr<c10d::Work> w) {
  if (!w) return;
  std::lock_guard<std::mutex> g(mu_);
  members_.push_back(std::move(w));
}

void CoalescedWork::seal() {
  {
    std::lock_guard<std::mutex> g(mu_);
    sealed_ = true;
  }
  sealed_cv_.notify_all();
}

size_t CoalescedWork::members() const {
  std::lock_guard<std::mutex> g(mu_);
  return members_.size();
}

std::vector<c10::intrusive_ptr<c10d::Work>> CoalescedWork::sealed_members(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeout == kNoTimeout) {
    sealed_cv_.wait(lk, [&] { return sealed_; });
  } else {
    TORCH_CHECK(sealed_cv_.wait_for(lk, timeout, [&] { return sealed_; }),
                "pycoll: Work.wait of a coalesced batch timed out before the batch was issued: wait after the "
                "coalescing block (batch_isend_irecv) ends");
  }
  return members_;
}

bool CoalescedWork::isCompleted() {
  std::vector<c10::intrusive_ptr<c10d::Work>> ms;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!sealed_) return false;
    ms = members_;
  }
  for (auto& w : ms) {
    if (!w->isCompleted()) return false;
  }
  return true;
}

bool CoalescedWork::isSuccess() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!sealed_) return false;
  for (const auto& w : members_) {
    if (!w->isSuccess()) return false;
  }
  return true;
}

std::exception_ptr CoalescedWork::exception() const {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& w : members_) {
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  for (auto& w : sealed_members(timeout)) w->wait(timeout);
  return true;
}

std::vector<at::Tensor> CoalescedWork::result() {
  std::vector<at::Tensor> out;
  for (auto& w : sealed_members(kNoTimeout)) {
    for (auto& t : w->result()) out.push_back(t);
  }
  return out;
}

c10::intrusive_ptr<c10::ivalue::Future> CoalescedWork::getFuture() {
  const auto ms = sealed_members(kNoTimeout);
  std::lock_guard<std::mutex> g(mu_);
  if (future_) return future_;
  // Completes when the last member's Future does, on the union of their devices, with their
  // values' tensors (or the first error).
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  std::vector<c10::Device> devices;
  for (const auto& w : ms) {
    auto f = w->getFuture();
    for (const auto& d : f->devices()) {
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    }
    futures.push_back(std::move(f));
  }
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  if (futures.empty()) {
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>()));
    return future_;
  }
  struct Pending {
    std::mutex mu;
    size_t left;
    std::vector<at::Tensor> tensors;
    std::exception_ptr err;
  };
  auto pending = std::make_shared<Pending>();
  pending->left = futures.size();
  auto out = future_;
  for (auto& f : futures) {
    f->addCallback([pending, out](c10::ivalue::Future& done) {
      bool last = false;
      {
        std::lock_guard<std::mutex> g(pending->mu);
        if (done.hasError()) {
          if (!pending->err) pending->err = done.exception_ptr();
        } else if (done.value().isTensorList()) {
          for (const auto& t : done.value().toTensorVector()) pending->tensors.push_back(t);
        }
        last = --pending->left == 0;
      }
      if (!last) return;
      if (pending->err) {
        out->setError(pending->err);
      } else {
        out->markCompleted(c10::IValue(pending->tensors));
      }
    });
  }
  return future_;
}

}  // namespace pycoll

// The one Work of a coalescing block (startCoalescing .. endCoalescing: batch_isend_irecv): done
// when every op issued in the block is. Handed out before the block ends (a deferred send or
// receive returns it), so it waits for seal() before it looks at its members.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace pycoll {

class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int rank, uint64_t seq);

  // Block side: add the ops' Works, then seal (no more members; waiters may proceed).
  void add(c10::intrusive_ptr<c10d::Work> w);
  void seal();
  size_t members() const;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override {}
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  uint64_t seq_;
  mutable std::mutex mu_;
  std::condition_variable sealed_cv_;
  bool sealed_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> members_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;

  // The members once sealed (waits for it, up to `timeout`).
  std::vector<c10::intrusive_ptr<c10d::Work>> sealed_members(std::chrono::milliseconds timeout);
};

}  // namespace pycoll

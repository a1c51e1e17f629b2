// Send and receive between a rank and itself (pipeline schedules with two
// stages on one rank, e.g. torch's ZBV schedule, exchange shapes this way;
// NCCL allows it). Matching is by tag, in posting order: the later of the
// pair copies the data, on the caller's current stream for CUDA tensors, and
// completes both.
#pragma once

#include <ATen/ATen.h>

#include <deque>
#include <map>
#include <mutex>

#include "backend/work.h"

namespace pycoll {

class SelfP2P {
 public:
  explicit SelfP2P(int rank) : rank_(rank) {}
  c10::intrusive_ptr<c10d::Work> send(const at::Tensor& t, int tag, uint64_t seq) { return post(t, tag, seq, true); }
  c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& t, int tag, uint64_t seq) { return post(t, tag, seq, false); }

 private:
  struct Pending {
    at::Tensor tensor;
    c10::intrusive_ptr<PycollWork> work;
  };
  // Queues the op, or completes it with the oldest unmatched one of the other kind for this tag.
  c10::intrusive_ptr<c10d::Work> post(const at::Tensor& t, int tag, uint64_t seq, bool is_send);
  c10::intrusive_ptr<PycollWork> make_work(c10d::OpType type, const at::Tensor& t, uint64_t seq) const;
  // Copies src into dst and completes both works (with the error, if sizes differ).
  static void complete(const Pending& send, const Pending& recv);

  int rank_;
  std::mutex mu_;
  std::map<int, std::deque<Pending>> sends_;  // by tag, unmatched
  std::map<int, std::deque<Pending>> recvs_;
};

}  // namespace pycoll

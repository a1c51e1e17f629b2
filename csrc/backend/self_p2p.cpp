#include "backend/self_p2p.h"

#include <stdexcept>

#include "common/check.h"

namespace pycoll {

c10::intrusive_ptr<PycollWork> SelfP2P::make_work(c10d::OpType type, const at::Tensor& t, uint64_t seq) const {
  const char* op = type == c10d::OpType::SEND ? "pycoll::send" : "pycoll::recv";
  return c10::make_intrusive<PycollWork>(rank_, type, op, seq, std::vector<at::Tensor>{t}, std::vector<c10::Device>{});
}

void SelfP2P::complete(const Pending& send, const Pending& recv) {
  std::exception_ptr err;
  try {
    if (send.tensor.numel() != recv.tensor.numel() || send.tensor.scalar_type() != recv.tensor.scalar_type()) {
      throw std::invalid_argument(str("pycoll: send to self of ", send.tensor.numel(), " elements of ",
                                      c10::toString(send.tensor.scalar_type()), " matched a receive of ",
                                      recv.tensor.numel(), " elements of ", c10::toString(recv.tensor.scalar_type())));
    }
    recv.tensor.copy_(send.tensor.view(recv.tensor.sizes()));
  } catch (...) {
    err = std::current_exception();
  }
  for (const auto& w : {send.work, recv.work}) {
    w->mark_done_and_settle(err);
  }
}

c10::intrusive_ptr<c10d::Work> SelfP2P::post(const at::Tensor& t, int tag, uint64_t seq, bool is_send) {
  Pending me{t, make_work(is_send ? c10d::OpType::SEND : c10d::OpType::RECV, t, seq)};
  std::unique_lock<std::mutex> g(mu_);
  auto& theirs = (is_send ? recvs_ : sends_)[tag];
  if (theirs.empty()) {
    (is_send ? sends_ : recvs_)[tag].push_back(me);
    return me.work;
  }
  Pending other = theirs.front();
  theirs.pop_front();
  g.unlock();
  if (is_send) {
    complete(me, other);
  } else {
    complete(other, me);
  }
  return me.work;
}

}  // namespace pycoll

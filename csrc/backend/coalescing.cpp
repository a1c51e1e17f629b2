// startCoalescing .. endCoalescing: what torch's batch_isend_irecv (and any _coalescing_manager
// with a device) brackets its ops with, as for NCCL's group calls.
//
// Inside the block, sends and receives that the CUDA engine serves are held, in posting order,
// and run together when the block ends (one launch when they fit: CudaOps::p2p_batch). Every
// other op (CPU tensors, a peer on another host, to self, a collective) runs when issued, as
// outside a block. The block's one Work covers all of them; a held op returns it too, so waiting
// on it before the block ends waits for the block.
#include "backend/process_group.h"

#include "common/setting.h"

namespace pycoll {

namespace {

const IntSetting kCoalesceP2P(
    "PYCOLL_COALESCE_P2P", 1, 0, 1, "backend", false, Audience::User,
    "1: the group supports coalescing, so batch_isend_irecv runs its sends and receives of CUDA tensors in one "
    "launch where they fit; 0: torch issues them one by one. Ranks may differ.");

}  // namespace

bool ProcessGroupPycoll::coalesce_p2p_from_settings() { return kCoalesceP2P.get() != 0; }

void ProcessGroupPycoll::startCoalescing() {
  std::lock_guard<std::mutex> g(coalescing_mu_);
  TORCH_CHECK(!coalescing_, "pycoll: startCoalescing: this group already has an open coalescing block");
  coalescing_.emplace();
  coalescing_->work = c10::make_intrusive<CoalescedWork>(rank_, issued_.load() + 1);
  coalescing_open_.store(true, std::memory_order_release);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::endCoalescing() {
  CoalescingBlock block;
  {
    std::lock_guard<std::mutex> g(coalescing_mu_);
    TORCH_CHECK(coalescing_, "pycoll: endCoalescing without startCoalescing");
    block = std::move(*coalescing_);
    coalescing_.reset();
    coalescing_open_.store(false, std::memory_order_release);
  }
  const auto& work = block.work;
  const bool handed_out = !block.device_p2p.empty();
  try {
    if (handed_out) {
      check_usable("pycoll::batch_isend_irecv");
      for (auto& w : cuda_->p2p_batch(block.device_p2p, ++issued_)) work->add(w);
    }
  } catch (...) {
    work->seal();
    throw;
  }
  work->seal();
  // Nothing issued in the block (torch aborting its groups inside one): no Work, as NCCL.
  if (!handed_out && work->members() == 0) return {};
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::in_block(c10::intrusive_ptr<c10d::Work> w) {
  if (!coalescing_open_.load(std::memory_order_acquire)) return w;  // every op asks: no lock outside a block
  std::lock_guard<std::mutex> g(coalescing_mu_);
  if (coalescing_) coalescing_->work->add(w);
  return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::defer_device_p2p(bool is_send, const at::Tensor& t, int peer) {
  std::lock_guard<std::mutex> g(coalescing_mu_);
  if (!coalescing_) return {};
  coalescing_->device_p2p.push_back({t, peer, is_send, ++issued_});
  return coalescing_->work;
}

}  // namespace pycoll

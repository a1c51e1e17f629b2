// send / recv: matched by (peer, tag) in posting order. A rank to itself goes through SelfP2P,
// CUDA tensors the CUDA engine serves through the device queue, everything else through the CPU
// engine's point-to-point channels (CUDA tensors staged through host memory).
#include "backend/process_group.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <memory>
#include <optional>

#include "backend/op_call_helpers.h"
#include "backend/op_stats.h"
#include "backend/tensor_args.h"
#include "common/check.h"
#include "engines/shared_storage_ref.h"

namespace pycoll {

namespace {

// What a request queued on a CPU engine lane keeps alive. The lane thread drops it after the
// callback: counted as background work until then (the exit waits for it, backend/executor.h),
// the count going last.
struct HeldRequest {
  HeldRequest(c10::intrusive_ptr<PycollWork> w, at::Tensor b, at::Tensor tensor)
      : work(std::move(w)), buf(std::move(b)), t(std::move(tensor)) {}
  BackgroundWork counted;
  c10::intrusive_ptr<PycollWork> work;
  at::Tensor buf;
  at::Tensor t;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  return point_to_point(/*is_send=*/true, tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  return point_to_point(/*is_send=*/false, tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::point_to_point(bool is_send, std::vector<at::Tensor>& tensors,
                                                                  int peer, int tag) {
  const char* op = is_send ? "pycoll::send" : "pycoll::recv";
  check_one_tensor(op, tensors);
  check_rank(op, peer, size_, is_send ? "destination rank" : "source rank");
  const at::Tensor t = tensors[0];
  check_dense(op, t, "tensor");
  check_usable(op);
  const FrHandle fr = record_p2p(is_send, t, peer, issued_.load() + 1);
  const ParamCommsRecord comms([&] {  // while the profiler records
    ParamCommsCall c = param_comms_group(op, t.scalar_type(), static_cast<int64_t>(issued_.load() + 1));
    c.in_elems = c.out_elems = t.numel();
    c.p2p = true;
    return c;
  });
  // engine: which one moves it, for the recorder ("self": a copy; "gloo": to another host).
  const auto tracked = [&fr](const char* engine, c10::intrusive_ptr<c10d::Work> w) {
    FlightRecorder::get().ran(fr, engine, "direct", std::string());
    if (auto* pw = dynamic_cast<PycollWork*>(w.get())) pw->track(fr);
    return w;
  };
  if (peer == rank_) {
    return in_block(tracked("self", is_send ? self_p2p_.send(t, tag, ++issued_) : self_p2p_.recv(t, tag, ++issued_)));
  }
  if (hosts_ && t.is_cuda()) {
    // Across hosts the CUDA engine spans this host's ranks (numbered by local rank). A peer on
    // another host gets it through host memory and Gloo, not NCCL: an unbatched NCCL send waits
    // for its receive, so a send then a receive on both ranks would deadlock, and our sends never block.
    const int local_peer = hosts_->local_rank(peer);
    if (local_peer >= 0 && on_cuda_engine(t)) return tracked("cuda", device_p2p(is_send, t, local_peer, fr));
    return in_block(tracked(local_peer >= 0 ? "cpu" : "gloo", host_p2p(is_send, op, t, peer, tag)));
  }
  if (on_cuda_engine(t)) return tracked("cuda", device_p2p(is_send, t, peer, fr));
  const bool other_host = hosts_ && hosts_->local_rank(peer) < 0;
  return in_block(tracked(other_host ? "gloo" : "cpu", host_p2p(is_send, op, t, peer, tag)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::device_p2p(bool is_send, const at::Tensor& t, int peer,
                                                              const FrHandle& fr) {
  if (auto held = defer_device_p2p(is_send, t, peer)) return held;  // inside a coalescing block
  return is_send ? cuda_->send(t, peer, ++issued_, fr) : cuda_->recv(t, peer, ++issued_, fr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const char* op = "pycoll::recv";
  check_one_tensor(op, tensors);
  const at::Tensor t = tensors[0];
  check_dense(op, t, "tensor");
  check_usable(op);
  // Sends of CUDA tensors travel on the CUDA engine, and across hosts on Gloo: a receive from any
  // source watches the CPU engine's channels, so it serves CPU tensors in a group on one host.
  TORCH_CHECK(t.is_cpu(), "pycoll::recv: receiving from any source (no src=) supports CPU tensors; got a ",
              t.device().str(), " tensor: pass src=");
  TORCH_CHECK(!hosts_,
              "pycoll::recv: receiving from any source (no src=) is not supported in a group across hosts: "
              "pass src=");
  const bool in_place = t.is_contiguous();
  at::Tensor buf = in_place ? t : at::empty(t.sizes(), t.options());
  auto work = c10::make_intrusive<PycollWork>(rank_, c10d::OpType::RECVANYSOURCE, op, ++issued_,
                                              std::vector<at::Tensor>{t}, std::vector<c10::Device>{});
  work->poll_before_sleep = poll_before_sleep_;
  auto held = std::make_shared<HeldRequest>(work, buf, t);
  cpu_->p2p().post_recv_any(tag, static_cast<char*>(buf.data_ptr()), static_cast<int64_t>(buf.nbytes()),
                            [held](int src, std::exception_ptr err) {
                              const auto& work = held->work;
                              const auto& buf = held->buf;
                              const auto& t = held->t;
                              if (!err && !buf.is_same(t)) {
                                try {
                                  write_back(t, buf);
                                } catch (...) {
                                  err = std::current_exception();
                                }
                              }
                              if (src >= 0) work->set_source_rank(src);
                              work->mark_done_and_settle(err);
                            });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::inter_host_p2p(bool is_send, const at::Tensor& t, int peer,
                                                                  int tag) {
  // Gloo moves CPU tensors: a CUDA (or non-contiguous) tensor goes through a host copy. A send
  // copies now and returns Gloo's Work; a receive lands in the copy, and a completion thread waits
  // for it and copies back on the caller's stream as it was when the receive was posted. Neither
  // blocks the caller, so two ranks may both send first.
  const bool in_place = t.is_cpu() && t.is_contiguous();
  at::Tensor buf = in_place ? t : at::empty(t.sizes(), t.options().device(at::kCPU));
  if (is_send && !in_place) buf.copy_(t);
  std::vector<at::Tensor> ts{buf.reshape({-1}).view(at::kByte)};
  auto gloo_work = is_send ? hosts_->flat->send(ts, peer, tag) : hosts_->flat->recv(ts, peer, tag);
  if (is_send || in_place) return gloo_work;
  std::optional<c10::Stream> stream;
  if (!t.is_cpu()) stream = c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
  auto work = c10::make_intrusive<PycollWork>(rank_, c10d::OpType::RECV, "pycoll::recv", ++issued_,
                                              std::vector<at::Tensor>{t}, std::vector<c10::Device>{});
  CompletionPool::instance().post([work, gloo_work, buf, t, stream] {
    std::exception_ptr err;
    try {
      gloo_work->wait();
      std::optional<c10::StreamGuard> on_stream;
      if (stream) on_stream.emplace(*stream);
      write_back(t, buf);
    } catch (...) {
      err = std::current_exception();
    }
    work->mark_done(err);
    work->settle_future();
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::host_p2p(bool is_send, const char* op, const at::Tensor& t, int peer,
                                                            int tag) {
  if (hosts_) {
    const int local_peer = hosts_->local_rank(peer);
    if (local_peer < 0) return inter_host_p2p(is_send, t, peer, tag);
    peer = local_peer;  // the CPU engine's channels are numbered by local rank
  }
  // The channel reads or writes `buf`: t itself when it is a contiguous CPU tensor, else a host
  // copy. A send copies before returning (the caller's stream as it is now); a receive copies
  // back on the channel's thread, on the caller's stream as it was when the receive was posted.
  const bool in_place = t.is_cpu() && t.is_contiguous();
  at::Tensor buf = in_place ? t : at::empty(t.sizes(), t.options().device(at::kCPU));
  if (is_send && !in_place) buf.copy_(t);
  std::optional<c10::Stream> stream;
  if (!t.is_cpu()) stream = c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
  auto work = c10::make_intrusive<PycollWork>(rank_, is_send ? c10d::OpType::SEND : c10d::OpType::RECV, op, ++issued_,
                                              std::vector<at::Tensor>{t}, std::vector<c10::Device>{});
  work->poll_before_sleep = poll_before_sleep_;
  const int64_t bytes = static_cast<int64_t>(buf.nbytes());
  char* data = static_cast<char*>(buf.data_ptr());
  if (is_send) {
    record_op("send", bytes, Algo::Direct, OpTimer(), -1, size_);
    // The caller must not modify t before wait(), as with every backend; buf lives until then.
    auto held = std::make_shared<HeldRequest>(work, buf, t);
    PointToPoint& p2p = cpu_->p2p();
    const SharedStorageRef shared = p2p.may_send_by_reference(bytes) ? shared_storage_of(buf) : SharedStorageRef{};
    p2p.post_send(
        peer, tag, data, bytes,
        [held](std::exception_ptr err) {
          const auto& work = held->work;
          work->mark_done_and_settle(err);
        },
        shared);
  } else {
    auto held = std::make_shared<HeldRequest>(work, buf, t);
    PointToPoint& p2p = cpu_->p2p();
    const SharedStorageRef into = p2p.may_receive_into_shared(bytes) ? shared_storage_of(buf) : SharedStorageRef{};
    p2p.post_recv(
        peer, tag, data, bytes,
        [held, stream](std::exception_ptr err) {
          const auto& work = held->work;
          const auto& buf = held->buf;
          const auto& t = held->t;
          if (!err && !buf.is_same(t)) {
            try {
              std::optional<c10::StreamGuard> on_stream;
              if (stream) on_stream.emplace(*stream);
              write_back(t, buf);
            } catch (...) {
              err = std::current_exception();
            }
          }
          work->mark_done_and_settle(err);
        },
        into);
  }
  return work;
}

}  // namespace pycoll

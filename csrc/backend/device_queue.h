// How an op on CUDA tensors becomes a Work, with ProcessGroupNCCL's stream semantics (see
// backend/cuda_ops.h, the one implementation). The backend talks to it through this
// interface only, so that the backend compiles the same with and without CUDA.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/flight_recorder.h"

namespace pycoll {

class Engine;

class DeviceQueue {
 public:
  virtual ~DeviceQueue() = default;

  // The engine of CUDA tensors on `device`, or nullptr when it cannot serve this group (a peer
  // on another host or without peer access). The first call is collective: every rank makes
  // its engine then, in the same order.
  virtual Engine* engine(const at::Device& device) = 0;
  // True when sends and receives of CUDA tensors on `device` run on the device (as engine(device)
  // does, collectively the first time); false where they stage through host memory (no engine, or
  // ranks sharing one GPU under PYCOLL_CUDA_SAME_DEVICE=auto, whose engine runs no kernels).
  virtual bool point_to_point_on_device(const at::Device& device) = 0;

  // Runs body on the stream the op belongs on and returns its Work: a synchronous collective
  // runs on the caller's current stream; an async one (and all point-to-point) on the group's
  // communication stream of its lane, ordered after the caller's stream. `tensors` stay alive
  // until the op ran; `outputs` are what the Future holds. `fr`: the op's flight-recorder entry,
  // whose states then follow events around its kernels (backend/cuda_op_watcher.h).
  enum class Lane { Collective = 0, Send = 1, Recv = 2 };
  using Body = std::function<void(const c10::Stream&)>;
  virtual c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* op, uint64_t seq,
                                                const std::vector<at::Tensor>& tensors,
                                                const std::vector<at::Tensor>& outputs, bool async_op, const Body& body,
                                                Lane lane, const FrHandle& fr) = 0;

  // Point-to-point on the CUDA engine (matched per peer in issue order).
  virtual c10::intrusive_ptr<c10d::Work> send(const at::Tensor& t, int dst, uint64_t seq, const FrHandle& fr) = 0;
  virtual c10::intrusive_ptr<c10d::Work> recv(const at::Tensor& t, int src, uint64_t seq, const FrHandle& fr) = 0;
  // A coalesced batch_isend_irecv's sends and receives on the CUDA engine, in posting order: one
  // launch (one Work) when the engine can run them together, else one send or receive (and Work)
  // each.
  struct P2PRequest {
    at::Tensor t;
    int peer;
    bool is_send;
    uint64_t seq;
  };
  virtual std::vector<c10::intrusive_ptr<c10d::Work>> p2p_batch(const std::vector<P2PRequest>& ops, uint64_t seq) = 0;

  // What an op of CUDA tensors that runs on the host (staged) does first, on the executor: waits on
  // the host until the group's device collectives issued before it have run (an asynchronous one
  // runs on the communication stream, which the caller's stream does not follow). Empty where
  // there is none to wait for.
  virtual std::function<void()> after_collectives(const at::Device& device) = 0;

  // ProcessGroup.abort(): every kernel of the group that waits on a peer ends (with an error the
  // next op raises) instead of holding the GPU until the group's timeout. Any thread, idempotent.
  virtual void abort() noexcept = 0;

  // The last traced kernel's timeline (PYCOLL_CUDA_TRACE=1); empty before the first CUDA collective.
  virtual std::vector<int64_t> trace() = 0;
};

// The CUDA device queue of a group, or nullptr in a build without CUDA.
std::unique_ptr<DeviceQueue> make_cuda_queue(c10::intrusive_ptr<c10d::Store> store, std::string group_name, int rank,
                                             int size, std::chrono::milliseconds timeout);

}  // namespace pycoll

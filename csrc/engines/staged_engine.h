// CUDA tensors through host memory: copies the inputs to the host, runs the op on an engine of
// host tensors (the CPU engine), copies the results back. The fallback for ops the CUDA engine
// does not run, for groups whose GPUs cannot map each other, and for builds without CUDA.
//
// Ordering: the copies run on the stream the backend passes (the caller's current stream when
// the op was issued), so they see what the caller queued before the call; the host waits for
// each copy, so the op is finished when run() returns.
#pragma once

#include "engines/engine.h"

namespace pycoll {

class StagedEngine : public Engine {
 public:
  explicit StagedEngine(Engine& host) : host_(host) {}
  const char* name() const override { return "staged"; }
  bool serves(OpCode op, at::ScalarType dtype, const at::Device& device) override;
  bool enqueues_on_device() const override { return false; }
  Algo run(const Collective& c, const c10::Stream& stream) override;

 private:
  Engine& host_;
};

}  // namespace pycoll

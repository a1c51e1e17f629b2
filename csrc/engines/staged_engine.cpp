#include "engines/staged_engine.h"

#include <c10/core/StreamGuard.h>

namespace pycoll {

bool StagedEngine::serves(OpCode op, at::ScalarType dtype, const at::Device& device) {
  return !device.is_cpu() && host_.serves(op, dtype, at::Device(at::kCPU));
}

Algo StagedEngine::run(const Collective& c, const c10::Stream& stream) {
  c10::StreamGuard on_callers_stream(stream);
  Collective host = c;
  if (c.input.defined()) host.input = c.input.to(at::kCPU);
  if (c.output.defined()) {
    // An in-place op stays in place on the host; an output's old contents matter only there.
    host.output =
        c.output.is_same(c.input) ? host.input : at::empty(c.output.sizes(), c.output.options().device(at::kCPU));
  }
  const Algo algo = host_.run(host, c10::Stream(c10::Stream::DEFAULT, at::Device(at::kCPU)));
  if (c.output.defined()) c.output.copy_(host.output);
  return algo;
}

}  // namespace pycoll

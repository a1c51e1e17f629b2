// The flight-recorder record id of the op this thread is issuing (0: none), for what an engine
// records about its own launches (the CUDA engine's traced kernels), without passing it through
// every call of the engine interface. Set by the backend around an op's issue.
#pragma once

#include <cstdint>

namespace pycoll {

uint64_t issuing_op();

// Makes `record_id` this thread's issuing op for the scope.
class IssuingOp {
 public:
  explicit IssuingOp(uint64_t record_id);
  ~IssuingOp();
  IssuingOp(const IssuingOp&) = delete;
  IssuingOp& operator=(const IssuingOp&) = delete;

 private:
  uint64_t previous_;
};

}  // namespace pycoll

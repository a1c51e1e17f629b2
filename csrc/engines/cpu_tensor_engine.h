// The CPU engine behind the engine interface: CPU tensors, shared memory between the ranks of
// one host (cpu/cpu_engine.h does the work on raw pointers).
#pragma once

#include <optional>
#include <string>

#include "common/types.h"
#include "cpu/plan.h"
#include "engines/engine.h"

namespace pycoll {

class CpuEngine;

class CpuTensorEngine : public Engine {
 public:
  explicit CpuTensorEngine(CpuEngine& cpu) : cpu_(cpu) {}
  const char* name() const override { return "cpu"; }
  bool serves(OpCode op, at::ScalarType dtype, const at::Device& device) override;
  bool enqueues_on_device() const override { return false; }
  Algo run(const Collective& c, const c10::Stream& stream) override;

 private:
  Algo run_op(const Collective& c, const c10::Stream& stream);
  // c.schedule's program, where it is one of c's collective (cpu/schedule_run.h); `dt` as run_op.
  bool run_schedule(const Collective& c, DType dt);

  CpuEngine& cpu_;
  std::optional<CpuPlan> described_;  // the plan description_ describes (run() reuses it)
  std::string description_;
};

}  // namespace pycoll

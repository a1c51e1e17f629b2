// The CUDA engine behind the engine interface: CUDA tensors of one host's GPUs, through CUDA IPC
// peer memory (cuda/cuda_engine.h does the work). run() enqueues on the stream it is given.
#pragma once

#include <memory>

#include "engines/engine.h"

namespace pycoll {

class CudaEngine;
struct ScheduleProgram;

class CudaTensorEngine : public Engine {
 public:
  explicit CudaTensorEngine(CudaEngine& cuda) : cuda_(cuda) {}
  const char* name() const override { return "cuda"; }
  // all_reduce, reduce, broadcast, all_gather, reduce_scatter, all_to_all; gather, scatter and
  // barrier go through host memory. Ranks sharing one GPU under PYCOLL_CUDA_SAME_DEVICE=auto: the
  // events path's four (all_reduce, reduce_scatter, all_gather, broadcast), from its size up.
  bool serves(OpCode op, at::ScalarType dtype, const at::Device& device) override;
  bool takes(OpCode op, Algo algo, int64_t bytes) const override;
  bool enqueues_on_device() const override { return true; }
  Algo run(const Collective& c, const c10::Stream& stream) override;

 private:
  // A schedule program's op (cuda/schedule_kernel.h): the buffers as the program expects them,
  // then the engine's kernel.
  Algo run_schedule(const Collective& c, const std::shared_ptr<const ScheduleProgram>& program,
                    const c10::Stream& stream);

  CudaEngine& cuda_;
};

}  // namespace pycoll

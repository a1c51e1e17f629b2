#include "engines/cpu_tensor_engine.h"

#include "cpu/cpu_engine.h"
#include "engines/dtypes.h"
#include "engines/shared_storage_ref.h"

namespace pycoll {

namespace {
char* bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<char*>(t.data_ptr()) : nullptr; }
}  // namespace

bool CpuTensorEngine::serves(OpCode op, at::ScalarType dtype, const at::Device& device) {
  return device.is_cpu() && (moves_as_bytes(op) || reducible_dtype(dtype).has_value());
}

Algo CpuTensorEngine::run(const Collective& c, const c10::Stream& stream) {
  const Algo ran = run_op(c, stream);
  if (c.plan_text && cpu_.last_plan()) {
    // Ops of a training step repeat the same few plans: describe each once (the flight recorder
    // asks for every op's plan, and formatting it costs more than the rest of its record).
    const CpuPlan& plan = *cpu_.last_plan();
    if (!described_ || !described_->describes_as(plan)) {
      described_ = plan;
      description_ = plan.describe();
    }
    *c.plan_text = description_;
  }
  return ran;
}

Algo CpuTensorEngine::run_op(const Collective& c, const c10::Stream& /*stream*/) {
  // Ops that only move data see bytes (any dtype); reductions see the element type.
  const at::Tensor& ref = c.input.defined() ? c.input : c.output;
  const DType dt = moves_as_bytes(c.op) ? DType::UInt8 : *reducible_dtype(ref.scalar_type());
  const auto count = [&](const at::Tensor& t) { return moves_as_bytes(c.op) ? t.nbytes() : t.numel(); };
  if (c.algo == Algo::Schedule && cpu_.size() > 1 && run_schedule(c, dt)) return Algo::Schedule;
  const Algo algo = is_single_host_algo(c.algo) ? c.algo : Algo::Auto;
  switch (c.op) {
    case OpCode::AllReduce: {
      const SharedStorageRef in = shared_storage_of(c.input);  // in place (the usual call): one lookup
      return cpu_.all_reduce(bytes_of(c.input), bytes_of(c.output), count(c.output), dt, c.reduce, algo,
                             {in, c.output.is_same(c.input) ? in : shared_storage_of(c.output)});
    }
    case OpCode::Reduce:
      return cpu_.reduce(bytes_of(c.input), bytes_of(c.output), count(c.input), dt, c.reduce, c.root, algo);
    case OpCode::Broadcast:
      return cpu_.broadcast(bytes_of(c.output), count(c.output), dt, c.root, algo, {shared_storage_of(c.output), {}});
    case OpCode::AllGather:
      return cpu_.all_gather(bytes_of(c.input), bytes_of(c.output), count(c.input), dt, algo,
                             {shared_storage_of(c.input), {}});
    case OpCode::ReduceScatter:
      return cpu_.reduce_scatter(bytes_of(c.input), bytes_of(c.output), count(c.output), dt, c.reduce, algo,
                                 {shared_storage_of(c.input), {}});
    case OpCode::Gather:
      cpu_.gather(bytes_of(c.input), bytes_of(c.output), count(c.input), dt, c.root);
      return Algo::Direct;
    case OpCode::Scatter:
      cpu_.scatter(bytes_of(c.input), bytes_of(c.output), count(c.output), dt, c.root);
      return Algo::Direct;
    case OpCode::AllToAll:
      cpu_.all_to_all(bytes_of(c.input), bytes_of(c.output), c.splits.send_bytes, c.splits.send_offsets,
                      c.splits.recv_bytes, c.splits.recv_offsets, dt);
      return Algo::Direct;
    case OpCode::Barrier: cpu_.barrier(); return Algo::Direct;
  }
  TORCH_INTERNAL_ASSERT(false, "pycoll: the CPU engine got an unknown op");
}

bool CpuTensorEngine::run_schedule(const Collective& c, DType dt) {
  const int n = cpu_.size();
  switch (c.op) {
    case OpCode::AllReduce:
    case OpCode::ReduceScatter:
      return cpu_.run_schedule(c.schedule, c.op, bytes_of(c.input), bytes_of(c.output), c.output.numel(), dt, c.reduce,
                               0);
    case OpCode::AllGather:
      return cpu_.run_schedule(c.schedule, c.op, bytes_of(c.input), bytes_of(c.output), c.input.nbytes(), dt, c.reduce,
                               0);
    case OpCode::Broadcast:
      return cpu_.run_schedule(c.schedule, c.op, bytes_of(c.output), bytes_of(c.output), c.output.nbytes(), dt,
                               c.reduce, c.root);
    case OpCode::Reduce:
      return cpu_.run_schedule(c.schedule, c.op, bytes_of(c.input), bytes_of(c.output), c.input.numel(), dt, c.reduce,
                               c.root);
    case OpCode::AllToAll: {
      // The language's all_to_all moves blocks of one size, one after the other.
      const int64_t block = static_cast<int64_t>(c.input.nbytes()) / n;
      const ByteSplits& s = c.splits;
      bool uneven = static_cast<int64_t>(c.output.nbytes()) != block * n || static_cast<int>(s.send_bytes.size()) != n;
      for (int j = 0; !uneven && j < n; ++j) {
        uneven = s.send_bytes[j] != block || s.recv_bytes[j] != block || s.send_offsets[j] != j * block ||
                 s.recv_offsets[j] != j * block;
      }
      return cpu_.run_schedule(c.schedule, c.op, bytes_of(c.input), bytes_of(c.output), block, dt, c.reduce, 0, uneven);
    }
    default: return false;  // gather, scatter, barrier: no schedules
  }
}

}  // namespace pycoll

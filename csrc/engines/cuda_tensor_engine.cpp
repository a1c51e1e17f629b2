#include "engines/cuda_tensor_engine.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/cuda_check.h"
#include "cpu/schedule_program.h"
#include "cuda/cuda_engine.h"
#include "cuda/kernel_type.h"
#include "cuda/schedule_kernel.h"
#include "engines/dtypes.h"

namespace pycoll {

namespace {

// The backend checked the user's arguments (backend/tensor_args.h) and made them dense; what
// reaches the engine otherwise is a bug of ours, not of the caller.
void check_tensor(const at::Tensor& t, const char* op, const char* name, int device) {
  TORCH_INTERNAL_ASSERT(t.defined() && t.is_cuda() && t.get_device() == device && t.is_contiguous(), "pycoll::", op,
                        ": ", name, " must be a contiguous tensor on cuda:", device);
}

// `out` holds `out_per_in` times the elements of `in` (1/n: reduce_scatter, given as -n).
void check_pair(const at::Tensor& in, const at::Tensor& out, int64_t out_per_in, const char* op, int device) {
  check_tensor(in, op, "input", device);
  check_tensor(out, op, "output", device);
  TORCH_CHECK(in.scalar_type() == out.scalar_type(), "pycoll::", op, ": output dtype ", out.scalar_type(),
              " differs from input dtype ", in.scalar_type());
  const bool ok = out_per_in > 0 ? out.numel() == in.numel() * out_per_in : in.numel() == out.numel() * -out_per_in;
  TORCH_CHECK(ok, "pycoll::", op, ": output has ", out.numel(), " elements for an input of ", in.numel(),
              out_per_in == 1 ? "" : " (the world size times as many on one side)");
}

DType kernel_dtype(const at::Tensor& t, const char* op) {
  const auto d = reducible_dtype(t.scalar_type());
  TORCH_INTERNAL_ASSERT(d.has_value(), "pycoll::", op, ": the engine cannot reduce ", t.scalar_type());
  return *d;
}

}  // namespace

bool CudaTensorEngine::serves(OpCode op, at::ScalarType dtype, const at::Device& device) {
  if (!device.is_cuda() || device.index() != cuda_.device()) return false;
  switch (op) {
    case OpCode::Broadcast:
    case OpCode::AllGather: return true;
    case OpCode::AllToAll: return !cuda_.kernels_off();
    case OpCode::Reduce:
      if (cuda_.kernels_off()) return false;
      [[fallthrough]];
    case OpCode::AllReduce:
    case OpCode::ReduceScatter: {
      const auto d = reducible_dtype(dtype);
      return d.has_value() && cuda_kernels_reduce(*d);
    }
    default: return false;
  }
}

bool CudaTensorEngine::takes(OpCode op, Algo algo, int64_t bytes) const {
  (void)op;
  // Ranks sharing one GPU (auto): a schedule program runs as kernels, so it stages (the CPU engine
  // runs it); so do messages below the size where the events path beats staging.
  return !cuda_.kernels_off() || (algo != Algo::Schedule && bytes >= cuda_.events_from_bytes());
}

Algo CudaTensorEngine::run(const Collective& c, const c10::Stream& stream) {
  const cudaStream_t s = c10::cuda::CUDAStream(stream).stream();
  const int dev = cuda_.device();
  const int n = cuda_.size();
  if (c.algo == Algo::Schedule && n > 1 && schedule_collective_name(c.op)) {
    // nullptr: a program of another collective (this op runs auto), as on the CPU engine.
    std::shared_ptr<const ScheduleProgram> program;
    try {
      program = schedule_program(c.schedule, c.op, n);
    } catch (const std::exception& e) {
      // The peers that could load it launch it and would wait for this rank until the timeout.
      std::string why = e.what();
      if (const auto nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
      cuda_.fail_before_launch("schedule program '" + c.schedule + "' could not be had here: " + why,
                               c10::cuda::CUDAStream(stream).stream());
      throw;
    }
    if (program) return run_schedule(c, program, stream);
  }
  const Algo algo = is_single_host_algo(c.algo) ? c.algo : Algo::Auto;
  const at::Tensor& in = c.input;
  const at::Tensor& out = c.output;
  switch (c.op) {
    case OpCode::AllReduce:
      check_pair(in, out, 1, "allreduce", dev);
      return cuda_.all_reduce(in.data_ptr(), out.data_ptr(), in.numel(), kernel_dtype(in, "allreduce"), c.reduce, algo,
                              s, c.plan_text);
    case OpCode::ReduceScatter:
      check_pair(in, out, -n, "reduce_scatter", dev);
      return cuda_.reduce_scatter(in.data_ptr(), out.data_ptr(), out.numel(), kernel_dtype(in, "reduce_scatter"),
                                  c.reduce, algo, s);
    case OpCode::AllGather:
      check_pair(in, out, n, "allgather", dev);
      return cuda_.all_gather(in.data_ptr(), out.data_ptr(), int64_t(in.nbytes()), algo, s);
    case OpCode::Broadcast:
      check_tensor(out, "broadcast", "tensor", dev);
      cuda_.broadcast(out.data_ptr(), int64_t(out.nbytes()), c.root, s);
      return Algo::OneShot;
    case OpCode::Reduce: {
      check_tensor(in, "reduce", "input", dev);
      const bool root = cuda_.rank() == c.root;
      if (root) check_pair(in, out, 1, "reduce", dev);
      cuda_.reduce(in.data_ptr(), root ? out.data_ptr() : nullptr, in.numel(), kernel_dtype(in, "reduce"), c.reduce,
                   c.root, s);
      return Algo::OneShot;
    }
    case OpCode::AllToAll:
      check_tensor(in, "alltoall", "input", dev);
      check_tensor(out, "alltoall", "output", dev);
      cuda_.all_to_all(in.data_ptr(), int64_t(in.nbytes()), out.data_ptr(), int64_t(out.nbytes()), c.splits.send_bytes,
                       c.splits.send_offsets, c.splits.recv_bytes, c.splits.recv_offsets, s);
      return Algo::Direct;
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "pycoll: the CUDA engine got an op it does not serve: ", op_name(c.op));
}

namespace {

bool overlap(const char* a, size_t a_bytes, const char* b, size_t b_bytes) {
  return a_bytes > 0 && b_bytes > 0 && a < b + b_bytes && b < a + a_bytes;
}

}  // namespace

Algo CudaTensorEngine::run_schedule(const Collective& c, const std::shared_ptr<const ScheduleProgram>& program,
                                    const c10::Stream& stream) {
  const cudaStream_t s = c10::cuda::CUDAStream(stream).stream();
  const int dev = cuda_.device();
  const int n = cuda_.size();
  const int rank = cuda_.rank();
  const OpCode op = c.op;
  const char* what = schedule_collective_name(op);
  const ScheduleProgram& p = *program;
  const at::Tensor& in = c.input;
  const at::Tensor& out = c.output;
  const bool rooted = op == OpCode::Broadcast || op == OpCode::Reduce;
  const bool is_root = rooted && rank == c.root;
  int64_t block = 0;    // elements of one block; bytes for ops that only move data
  bool uneven = false;  // all_to_all with splits the program cannot move: refused after a poisoned run
  switch (op) {
    case OpCode::AllReduce:
      check_pair(in, out, 1, what, dev);
      block = out.numel();
      break;
    case OpCode::ReduceScatter:
      check_pair(in, out, -n, what, dev);
      block = out.numel();
      break;
    case OpCode::AllGather:
      check_pair(in, out, n, what, dev);
      block = int64_t(in.nbytes());
      break;
    case OpCode::Broadcast:
      check_tensor(out, what, "tensor", dev);
      block = int64_t(out.nbytes());
      break;
    case OpCode::Reduce:
      check_tensor(in, what, "input", dev);
      if (is_root) check_pair(in, out, 1, what, dev);
      block = in.numel();
      break;
    case OpCode::AllToAll: {
      check_tensor(in, what, "input", dev);
      check_tensor(out, what, "output", dev);
      // The language's all_to_all moves blocks of one size, one after the other.
      block = int64_t(in.nbytes()) / n;
      const ByteSplits& sp = c.splits;
      uneven = int64_t(out.nbytes()) != block * n || int64_t(in.nbytes()) != block * n ||
               int(sp.send_bytes.size()) != n || int(sp.recv_bytes.size()) != n;
      for (int j = 0; !uneven && j < n; ++j) {
        uneven = sp.send_bytes[j] != block || sp.recv_bytes[j] != block || sp.send_offsets[j] != j * block ||
                 sp.recv_offsets[j] != j * block;
      }
      break;
    }
    default: TORCH_INTERNAL_ASSERT(false, "pycoll: no schedule program runs ", op_name(op));
  }
  const bool reduces = !moves_as_bytes(op);
  gpu::KernelType kt{DType::UInt8, kernels::ReduceOp::Sum, 1};
  if (reduces) kt = gpu::kernel_type(kernel_dtype(in, what), c.reduce, n, what);
  const int64_t E = int64_t(dtype_size(kt.dtype));
  if (c.plan_text) *c.plan_text = "schedule " + c.schedule + " lanes=" + std::to_string(std::max(1, p.lanes));
  // Fails here, on every rank alike, where the program cannot run on this engine.
  const ScheduleGeometry geometry = cuda_.plan_schedule(p, block, E);
  const auto refuse_uneven = [&] {
    throw std::invalid_argument("pycoll::alltoall: schedule program '" + p.name +
                                "' moves blocks of one size, but this rank's splits differ; use equal splits or "
                                "another algorithm");
  };
  if (block == 0) {
    if (uneven) refuse_uneven();
    return Algo::Schedule;
  }

  // Temporaries come from the caching allocator on the collectives' stream: freed when this call
  // returns, reused only by work ordered after it there.
  c10::cuda::CUDAStreamGuard on_stream(stream);
  const auto bytes_tensor = [&](size_t bytes) {
    return at::empty({int64_t(bytes)},
                     at::TensorOptions().dtype(at::kByte).device(at::kCUDA, static_cast<c10::DeviceIndex>(dev)));
  };
  const auto copy = [&](void* dst, const void* src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    PYCOLL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "pycoll::", what,
                      ": schedule program's buffers: ", "cudaMemcpyAsync");
  };
  at::Tensor tmp_in, tmp_out;
  const auto copy_of = [&](const char* from, size_t bytes) {
    tmp_in = bytes_tensor(bytes);
    copy(tmp_in.data_ptr(), from, bytes);
    return static_cast<char*>(tmp_in.data_ptr());
  };

  // The buffers as the program expects them: aliased where it is in place, apart where it is not
  // (as the CPU engine's run_schedule).
  const bool many_in = op == OpCode::ReduceScatter || op == OpCode::AllToAll;
  const bool many_out = op == OpCode::AllGather || op == OpCode::AllToAll;
  const size_t in_bytes = size_t(block * E) * (many_in ? n : 1);
  const size_t out_bytes = size_t(block * E) * (many_out ? n : 1);
  const bool has_out = op != OpCode::Reduce || is_root;
  char* pin = static_cast<char*>(op == OpCode::Broadcast ? out.data_ptr() : in.data_ptr());
  char* pout = has_out ? static_cast<char*>(out.data_ptr()) : nullptr;
  char* copy_back = nullptr;  // an in-place reduce_scatter run on a copy of the input: the output
  if (p.inplace) {
    if (uneven) {  // the poisoned run moves block * n bytes, more than `out` may hold: on a copy
      pin = pout = copy_of(pin, in_bytes);
    } else if (op == OpCode::AllGather) {
      char* mine = pout + size_t(rank) * block * E;
      if (pin != mine) {
        if (overlap(pin, in_bytes, pout, out_bytes)) pin = copy_of(pin, in_bytes);
        copy(mine, pin, size_t(block * E));
      }
      pin = mine;
    } else if (op == OpCode::ReduceScatter) {
      if (pout != pin + size_t(rank) * block * E) {
        pin = copy_of(pin, in_bytes);
        copy_back = pout;
        pout = pin + size_t(rank) * block * E;
      }
    } else if (pout == nullptr) {  // reduce off the root: its input stays as it was
      pin = pout = copy_of(pin, in_bytes);
    } else if (pin != pout) {
      if (overlap(pin, in_bytes, pout, out_bytes)) pin = copy_of(pin, in_bytes);
      copy(pout, pin, in_bytes);
      pin = pout;
    }
  } else {
    if (pout == nullptr || uneven) {  // uneven: the poisoned run reads `in` (block * n bytes at least)
      tmp_out = bytes_tensor(out_bytes);
      pout = static_cast<char*>(tmp_out.data_ptr());
    }
    if (overlap(pin, in_bytes, pout, out_bytes)) pin = copy_of(pin, in_bytes);
  }
  // Per call, like the temporaries: collectives run on the caller's stream or the engine's, and
  // one kept across calls would be freed (when grown) on the stream it was made on while a kernel
  // on another may still use it, or while a captured CUDA graph still names it.
  at::Tensor scratch;
  if (geometry.scratch_bytes > 0) scratch = bytes_tensor(size_t(geometry.scratch_bytes));

  ScheduleCall call;
  call.program = program;
  call.op = op;
  call.root = rooted ? c.root : 0;
  // A rooted op whose root is not the program's runs it with the ranks rotated.
  call.rank_shift = rooted && p.root >= 0 ? ((c.root - p.root) % n + n) % n : 0;
  call.me = ((rank - call.rank_shift) % n + n) % n;
  call.block = block;
  call.check_count = block;
  call.dtype = kt.dtype;
  call.rop = kt.op;
  call.div = kt.div;
  call.holds_result = op == OpCode::AllReduce || op == OpCode::ReduceScatter || (op == OpCode::Reduce && is_root);
  call.reduces = reduces;
  call.in = pin;
  call.out = pout;
  call.scratch = scratch.defined() ? static_cast<char*>(scratch.data_ptr()) : nullptr;
  call.poisoned = uneven;
  cuda_.run_schedule(call, s);
  if (uneven) refuse_uneven();
  if (copy_back) copy(copy_back, pout, size_t(block * E));
  return Algo::Schedule;
}

}  // namespace pycoll

#include "engines/cuda_tensor_engine.h"

#include <c10/cuda/CUDAStream.h>

#include <stdexcept>
#include <string>

#include "cpu/schedule_program.h"
#include "cuda/cuda_engine.h"
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
    case OpCode::AllGather:
    case OpCode::AllToAll: return true;
    case OpCode::AllReduce:
    case OpCode::Reduce:
    case OpCode::ReduceScatter: {
      const auto d = reducible_dtype(dtype);
      return d.has_value() && cuda_kernels_reduce(*d);
    }
    default: return false;
  }
}

Algo CudaTensorEngine::run(const Collective& c, const c10::Stream& stream) {
  const cudaStream_t s = c10::cuda::CUDAStream(stream).stream();
  const int dev = cuda_.device();
  const int n = cuda_.size();
  if (c.algo == Algo::Schedule && schedule_collective_name(c.op) && schedule_program(c.schedule, c.op, n)) {
    throw std::invalid_argument("pycoll: schedule program '" + c.schedule +
                                "' runs on CPU tensors only: the CUDA engine does not run schedule programs yet; "
                                "use CPU tensors, or pycollectives.set_algo('auto') for CUDA tensors");
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

}  // namespace pycoll

#include "engines/cuda/cuda_tensor_engine.h"

#include <c10/cuda/CUDAStream.h>

#include <stdexcept>
#include <string>

#include "cpu/schedule_program.h"
#include "cuda/cuda_engine.h"
#include "engines/dtypes.h"

namespace pycoll {

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
  at::Tensor out = c.output;
  if (c.algo == Algo::Schedule && schedule_collective_name(c.op) && schedule_program(c.schedule, c.op, cuda_.size())) {
    throw std::invalid_argument("pycoll: schedule program '" + c.schedule +
                                "' runs on CPU tensors only: the CUDA engine does not run schedule programs yet; "
                                "use CPU tensors, or pycollectives.set_algo('auto') for CUDA tensors");
  }
  const Algo algo = is_single_host_algo(c.algo) ? c.algo : Algo::Auto;
  switch (c.op) {
    case OpCode::AllReduce: return cuda_.all_reduce(c.input, out, c.reduce, algo, s, c.plan_text);
    case OpCode::ReduceScatter: return cuda_.reduce_scatter(c.input, out, c.reduce, algo, s);
    case OpCode::AllGather: return cuda_.all_gather(c.input, out, algo, s);
    case OpCode::Broadcast: cuda_.broadcast(out, c.root, s); return Algo::OneShot;
    case OpCode::Reduce: cuda_.reduce(c.input, out, c.root, c.reduce, s); return Algo::OneShot;
    case OpCode::AllToAll:
      cuda_.all_to_all(c.input, out, c.splits.send_bytes, c.splits.send_offsets, c.splits.recv_bytes,
                       c.splits.recv_offsets, s);
      return Algo::Direct;
    default: break;
  }
  TORCH_INTERNAL_ASSERT(false, "pycoll: the CUDA engine got an op it does not serve: ", op_name(c.op));
}

}  // namespace pycoll

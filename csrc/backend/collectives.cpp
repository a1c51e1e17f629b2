// The collectives' entry points: argument checks, then an OpCall for the runner (process_group.cpp).
#include "backend/process_group.h"

#include "backend/op_call_helpers.h"
#include "backend/tensor_args.h"
#include "common/check.h"

namespace pycoll {

namespace {

at::Tensor premul_factor_of(const c10d::ReduceOp& op, ReduceKind rk) {
  return rk == ReduceKind::PremulSum ? premul_factor(op) : at::Tensor();
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  static constexpr const char* kOp = "pycoll::allreduce";
  check_one_tensor(kOp, tensors);
  const at::Tensor t = tensors[0];
  if (t.layout() == at::kSparse) return sparse_allreduce(t, opts);
  check_dense(kOp, t, "tensor");
  const ReduceKind rk = to_reduce(kOp, opts.reduceOp, t.scalar_type());
  OpCall call = new_call(c10d::OpType::ALLREDUCE, OpCode::AllReduce, kOp, "allreduce", t, opts.asyncOp);
  call.tensors = call.outputs = {t};
  call.premul_factor = premul_factor_of(opts.reduceOp, rk);
  call.logged_bytes = static_cast<int64_t>(t.nbytes());
  call.direct = engine_call(OpCode::AllReduce, t, t, rk);
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceOptions& opts) {
  static constexpr const char* kOp = "pycoll::allreduce_sparse";
  check_one_tensor(kOp, tensors);
  TORCH_CHECK_VALUE(tensors[0].layout() == at::kSparse, kOp, ": expected a sparse COO tensor, got layout ",
                    tensors[0].layout());
  return sparse_allreduce(tensors[0], opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  static constexpr const char* kOp = "pycoll::broadcast";
  check_one_tensor(kOp, tensors);
  check_rank(kOp, opts.rootRank, size_, "root rank");
  TORCH_CHECK_VALUE(opts.rootTensor == 0, kOp, ": rootTensor must be 0, got ", opts.rootTensor);
  const at::Tensor t = tensors[0];
  check_dense(kOp, t, "tensor");
  const int root = static_cast<int>(opts.rootRank);
  OpCall call = new_call(c10d::OpType::BROADCAST, OpCode::Broadcast, kOp, "broadcast", t, opts.asyncOp);
  call.tensors = call.outputs = {t};
  call.logged_bytes = rank_ == root ? static_cast<int64_t>(t.nbytes()) : 0;
  call.direct = engine_call(OpCode::Broadcast, t, t, ReduceKind::Sum, root);
  call.write_back = rank_ != root;
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  static constexpr const char* kOp = "pycoll::reduce";
  check_one_tensor(kOp, tensors);
  check_rank(kOp, opts.rootRank, size_, "root rank");
  const at::Tensor t = tensors[0];
  check_dense(kOp, t, "tensor");
  const ReduceKind rk = to_reduce(kOp, opts.reduceOp, t.scalar_type());
  const int root = static_cast<int>(opts.rootRank);
  OpCall call = new_call(c10d::OpType::REDUCE, OpCode::Reduce, kOp, "reduce", t, opts.asyncOp);
  call.tensors = call.outputs = {t};
  call.premul_factor = premul_factor_of(opts.reduceOp, rk);
  call.logged_bytes = static_cast<int64_t>(t.nbytes());
  call.direct = engine_call(OpCode::Reduce, t, t, rk, root);
  call.write_back = rank_ == root;
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::allgather";
  check_one_tensor(kOp, inputs);
  TORCH_CHECK_VALUE(outputs.size() == 1, kOp, ": expected one output list, got ", outputs.size());
  const at::Tensor in = inputs[0];
  check_dense(kOp, in, "input");
  const std::vector<at::Tensor> outs = outputs[0];
  TORCH_CHECK_VALUE(static_cast<int>(outs.size()) == size_, kOp, ": the output list has ", outs.size(),
                    " tensors but the group has ", size_, " ranks");
  bool uneven = false;
  for (const auto& o : outs) {
    check_dense(kOp, o, "output");
    check_same_type(kOp, in, o, "an output tensor");
    uneven = uneven || o.numel() != in.numel();
  }
  // Outputs of different sizes: an all_gather_v (rank r sends outputs[r].numel() elements).
  TORCH_CHECK_VALUE(!uneven || outs[rank_].numel() == in.numel(), kOp, ": this rank's output tensor (index ", rank_,
                    ") has ", outs[rank_].numel(), " elements but the input has ", in.numel());
  OpCall call = new_call(c10d::OpType::ALLGATHER, OpCode::AllGather, kOp, "allgather", in, opts.asyncOp);
  call.tensors = outs;
  call.tensors.push_back(in);
  call.outputs = outs;
  call.logged_bytes = static_cast<int64_t>(in.nbytes());
  const int n = size_;
  if (uneven) {
    const int64_t row = largest_numel(outs);
    call.prepare = [in, n, row] {
      return std::vector<Collective>{
          engine_call(OpCode::AllGather, padded_rows({in}, row), at::empty({row * n}, in.options()))};
    };
    call.finish = [outs, row](const std::vector<Collective>& p) { unpad_rows(p[0].output, row, outs); };
    return run(std::move(call));
  }
  call.prepare = [in, n] {
    return std::vector<Collective>{
        engine_call(OpCode::AllGather, dense(in), at::empty({in.numel() * n}, in.options()))};
  };
  call.finish = [outs](const std::vector<Collective>& p) { split_into(p[0].output, outs); };
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::allgather_into_tensor";
  check_dense(kOp, input, "input");
  check_dense(kOp, output, "output");
  check_same_type(kOp, input, output, "the output");
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, kOp, ": the output has ", output.numel(),
                    " elements but must have world_size * input = ", input.numel() * size_);
  const at::Tensor in = input, out = output;
  OpCall call = new_call(c10d::OpType::_ALLGATHER_BASE, OpCode::AllGather, kOp, "allgather", in, opts.asyncOp);
  call.tensors = {in, out};
  call.outputs = {out};
  call.logged_bytes = static_cast<int64_t>(in.nbytes());
  call.direct = engine_call(OpCode::AllGather, in, out);
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::gather";
  check_one_tensor(kOp, inputs);
  check_rank(kOp, opts.rootRank, size_, "root rank");
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor in = inputs[0];
  check_dense(kOp, in, "input");
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, kOp,
                      ": the root needs one output list of ", size_, " tensors");
    outs = outputs[0];
    for (const auto& o : outs) {
      check_dense(kOp, o, "output");
      check_same_type(kOp, in, o, "an output tensor");
      TORCH_CHECK_VALUE(o.numel() == in.numel(), kOp, ": an output tensor has ", o.numel(),
                        " elements but the input has ", in.numel());
    }
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), kOp, ": only the root (rank ",
                      root, ") takes output tensors");
  }
  OpCall call = new_call(c10d::OpType::GATHER, OpCode::Gather, kOp, "gather", in, opts.asyncOp);
  call.tensors = outs;
  call.tensors.push_back(in);
  call.outputs = outs;
  call.logged_bytes = static_cast<int64_t>(in.nbytes());
  const bool is_root = rank_ == root;
  const int n = size_;
  call.prepare = [in, is_root, n, root] {
    at::Tensor flat = is_root ? at::empty({in.numel() * n}, in.options()) : at::Tensor();
    return std::vector<Collective>{engine_call(OpCode::Gather, dense(in), flat, ReduceKind::Sum, root)};
  };
  call.finish = [outs, is_root](const std::vector<Collective>& p) {
    if (is_root) split_into(p[0].output, outs);
  };
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::GatherOptions& opts) {
  std::vector<std::vector<at::Tensor>> outs;
  if (rank_ == opts.rootRank) {
    outs.emplace_back();
    for (int r = 0; r < size_; ++r) outs[0].push_back(output.reshape({-1}).narrow(0, r * input.numel(), input.numel()));
  }
  std::vector<at::Tensor> ins{input};
  return gather(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  static constexpr const char* kOp = "pycoll::scatter";
  check_one_tensor(kOp, outputs);
  check_rank(kOp, opts.rootRank, size_, "root rank");
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor out = outputs[0];
  check_dense(kOp, out, "output");
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, kOp,
                      ": the root needs one input list of ", size_, " tensors");
    ins = inputs[0];
    for (const auto& i : ins) {
      check_dense(kOp, i, "input");
      check_same_type(kOp, out, i, "an input tensor");
      TORCH_CHECK_VALUE(i.numel() == out.numel(), kOp, ": an input tensor has ", i.numel(),
                        " elements but the output has ", out.numel());
    }
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), kOp, ": only the root (rank ", root,
                      ") takes input tensors");
  }
  OpCall call = new_call(c10d::OpType::SCATTER, OpCode::Scatter, kOp, "scatter", out, opts.asyncOp);
  call.tensors = ins;
  call.tensors.push_back(out);
  call.outputs = {out};
  call.logged_bytes = rank_ == root ? static_cast<int64_t>(out.nbytes()) * size_ : 0;
  call.prepare = [ins, out, root] {
    at::Tensor flat = ins.empty() ? at::Tensor() : flat_cat(ins);
    return std::vector<Collective>{engine_call(OpCode::Scatter, flat, dense(out), ReduceKind::Sum, root)};
  };
  call.finish = [out](const std::vector<Collective>& p) { write_back(out, p[0].output); };
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "pycoll::reduce_scatter";
  check_one_tensor(kOp, outputs);
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, kOp,
                    ": expected one input list of ", size_, " tensors");
  const at::Tensor out = outputs[0];
  check_dense(kOp, out, "output");
  bool uneven = false;
  for (const auto& i : inputs[0]) {
    check_dense(kOp, i, "input");
    check_same_type(kOp, out, i, "an input tensor");
    uneven = uneven || i.numel() != out.numel();
  }
  // Inputs of different sizes: a reduce_scatter_v (rank r receives the sum of inputs[r]).
  TORCH_CHECK_VALUE(!uneven || inputs[0][rank_].numel() == out.numel(), kOp, ": this rank's input tensor (index ",
                    rank_, ") has ", inputs[0][rank_].numel(), " elements but the output has ", out.numel());
  const ReduceKind rk = to_reduce(kOp, opts.reduceOp, out.scalar_type());
  const std::vector<at::Tensor> ins = inputs[0];
  OpCall call = new_call(c10d::OpType::REDUCE_SCATTER, OpCode::ReduceScatter, kOp, "reduce_scatter", out, opts.asyncOp);
  call.tensors = ins;
  call.tensors.push_back(out);
  call.outputs = {out};
  call.premul_factor = premul_factor_of(opts.reduceOp, rk);
  call.logged_bytes = static_cast<int64_t>(out.nbytes()) * size_;
  // Every rank's output is its own input's size: the row every rank reduces weighs alike.
  call.weighed_bytes = largest_numel(ins) * static_cast<int64_t>(out.element_size());
  if (uneven) {
    const int64_t row = largest_numel(ins);
    call.prepare = [ins, out, rk, row] {
      return std::vector<Collective>{
          engine_call(OpCode::ReduceScatter, padded_rows(ins, row), at::empty({row}, out.options()), rk)};
    };
    call.finish = [out, row](const std::vector<Collective>& p) { unpad_rows(p[0].output, row, {out}); };
    return run(std::move(call));
  }
  call.prepare = [ins, out, rk] {
    return std::vector<Collective>{engine_call(OpCode::ReduceScatter, flat_cat(ins), dense(out), rk)};
  };
  call.finish = [out](const std::vector<Collective>& p) { write_back(out, p[0].output); };
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "pycoll::reduce_scatter_tensor";
  check_dense(kOp, input, "input");
  check_dense(kOp, output, "output");
  check_same_type(kOp, input, output, "the output");
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, kOp, ": the input has ", input.numel(),
                    " elements but must have world_size * output = ", output.numel() * size_);
  const ReduceKind rk = to_reduce(kOp, opts.reduceOp, input.scalar_type());
  const at::Tensor in = input, out = output;
  OpCall call =
      new_call(c10d::OpType::_REDUCE_SCATTER_BASE, OpCode::ReduceScatter, kOp, "reduce_scatter", in, opts.asyncOp);
  call.tensors = {in, out};
  call.outputs = {out};
  call.premul_factor = premul_factor_of(opts.reduceOp, rk);
  call.logged_bytes = static_cast<int64_t>(in.nbytes());
  call.direct = engine_call(OpCode::ReduceScatter, in, out, rk);
  return run(std::move(call));
}

namespace {

// all_to_all_single's split sizes (rows of dim 0; empty means equal parts) as bytes and offsets.
void byte_splits(const char* op, const at::Tensor& t, const std::vector<int64_t>& splits, int size, const char* what,
                 std::vector<int64_t>& bytes, std::vector<int64_t>& offsets) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row_bytes = rows == 0 ? 0 : static_cast<int64_t>(t.nbytes()) / rows;
  bytes.assign(size, 0);
  offsets.assign(size, 0);
  if (splits.empty()) {
    TORCH_CHECK_VALUE(rows % size == 0, op, ": ", what, " has ", rows, " rows, not divisible by world size ", size,
                      " (pass split sizes)");
    for (int r = 0; r < size; ++r) bytes[r] = rows / size * row_bytes;
  } else {
    TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size, op, ": ", what, " split sizes have ", splits.size(),
                      " entries for ", size, " ranks");
    int64_t sum = 0;
    for (int r = 0; r < size; ++r) {
      TORCH_CHECK_VALUE(splits[r] >= 0, op, ": negative split size ", splits[r]);
      sum += splits[r];
      bytes[r] = splits[r] * row_bytes;
    }
    TORCH_CHECK_VALUE(sum == rows, op, ": ", what, " split sizes add up to ", sum, " but dim 0 has ", rows, " rows");
  }
  int64_t off = 0;
  for (int r = 0; r < size; ++r) {
    offsets[r] = off;
    off += bytes[r];
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions& opts) {
  static constexpr const char* kOp = "pycoll::alltoall_base";
  check_dense(kOp, input, "input");
  check_dense(kOp, output, "output");
  check_same_type(kOp, input, output, "the output");
  ByteSplits splits;
  byte_splits(kOp, input, input_splits, size_, "input", splits.send_bytes, splits.send_offsets);
  byte_splits(kOp, output, output_splits, size_, "output", splits.recv_bytes, splits.recv_offsets);
  const at::Tensor in = input, out = output;
  OpCall call = new_call(c10d::OpType::ALLTOALL_BASE, OpCode::AllToAll, kOp, "alltoall", in, opts.asyncOp);
  call.tensors = {in, out};
  call.outputs = {out};
  call.logged_bytes = static_cast<int64_t>(in.nbytes());
  call.direct = engine_call(OpCode::AllToAll, in, out);
  call.direct.splits = std::move(splits);
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  static constexpr const char* kOp = "pycoll::alltoall";
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_, kOp,
                    ": expected ", size_, " input and output tensors, got ", inputs.size(), " and ", outputs.size());
  for (int r = 0; r < size_; ++r) {
    check_dense(kOp, inputs[r], "input");
    check_dense(kOp, outputs[r], "output");
    check_same_type(kOp, inputs[0], inputs[r], "an input");
    check_same_type(kOp, inputs[0], outputs[r], "an output");
  }
  ByteSplits splits;
  int64_t sent = 0, received = 0;
  for (int r = 0; r < size_; ++r) {
    splits.send_bytes.push_back(static_cast<int64_t>(inputs[r].nbytes()));
    splits.send_offsets.push_back(sent);
    sent += splits.send_bytes.back();
    splits.recv_bytes.push_back(static_cast<int64_t>(outputs[r].nbytes()));
    splits.recv_offsets.push_back(received);
    received += splits.recv_bytes.back();
  }
  const std::vector<at::Tensor> ins = inputs, outs = outputs;
  OpCall call = new_call(c10d::OpType::ALLTOALL, OpCode::AllToAll, kOp, "alltoall", ins[0], opts.asyncOp);
  call.tensors = ins;
  call.tensors.insert(call.tensors.end(), outs.begin(), outs.end());
  call.outputs = outs;
  call.logged_bytes = sent;
  const int64_t received_elems = received / static_cast<int64_t>(ins[0].element_size());
  call.prepare = [ins, splits, received_elems] {
    Collective c = engine_call(OpCode::AllToAll, flat_cat(ins), at::empty({received_elems}, ins[0].options()));
    c.splits = splits;
    return std::vector<Collective>{c};
  };
  call.finish = [outs](const std::vector<Collective>& p) { split_into(p[0].output, outs); };
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::barrier(const c10d::BarrierOptions& opts) {
  static constexpr const char* kOp = "pycoll::barrier";
  OpCall call;
  call.type = c10d::OpType::BARRIER;
  call.op = OpCode::Barrier;
  call.name = kOp;
  call.stats_name = "barrier";
  call.async = opts.asyncOp;
  call.dtype = at::kByte;
  call.direct = engine_call(OpCode::Barrier, at::Tensor(), at::Tensor());
  return run(std::move(call));
}

}  // namespace pycoll

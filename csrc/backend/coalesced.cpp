// The coalesced forms: several tensors in one call, one sequence number and one Work. The
// all_reduce form runs as one all_reduce of the tensors laid end to end; the all_gather and
// reduce_scatter forms run one engine call per tensor (their layouts do not concatenate).
#include "backend/process_group.h"

#include "backend/op_call_helpers.h"
#include "backend/tensor_args.h"
#include "common/check.h"

namespace pycoll {

namespace {

int64_t total_bytes(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += static_cast<int64_t>(t.nbytes());
  return n;
}

// The tensor-pair forms: input i and output i of any dtype, the bigger one world_size times the
// other (all_gather: the output; reduce_scatter: the input).
void check_pairs(const char* op, const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs,
                 int size, bool output_is_bigger) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), op, ": got ", outputs.size(), " outputs for ", inputs.size(),
                    " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_dense(op, inputs[i], "input");
    check_dense(op, outputs[i], "output");
    check_same_type(op, inputs[i], outputs[i], "an output");
    const at::Tensor& big = output_is_bigger ? outputs[i] : inputs[i];
    const at::Tensor& small = output_is_bigger ? inputs[i] : outputs[i];
    TORCH_CHECK_VALUE(big.numel() == small.numel() * size, op, ": ", output_is_bigger ? "output " : "input ", i,
                      " has ", big.numel(), " elements but must have world_size * ",
                      output_is_bigger ? "input" : "output", " = ", small.numel() * size);
  }
}

// One engine call per pair, in one Work. kinds: the reduction per pair (empty: data movement).
OpCall pairwise_call(c10d::OpType type, OpCode op, const char* name, const char* stats_name,
                     const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
                     std::vector<ReduceKind> kinds, bool async) {
  OpCall call = new_call(type, op, name, stats_name, ins[0], async);
  call.outputs = outs;
  call.tensors = outs;
  call.tensors.insert(call.tensors.end(), ins.begin(), ins.end());
  call.logged_bytes = total_bytes(ins);
  call.prepare = [ins, outs, kinds, op] {
    std::vector<Collective> parts;
    for (size_t i = 0; i < ins.size(); ++i) {
      parts.push_back(engine_call(op, dense(ins[i]), dense(outs[i]), kinds.empty() ? ReduceKind::Sum : kinds[i]));
    }
    return parts;
  };
  call.finish = [outs](const std::vector<Collective>& p) {
    for (size_t i = 0; i < p.size(); ++i) write_back(outs[i], p[i].output);
  };
  return call;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  static constexpr const char* kOp = "pycoll::allreduce_coalesced";
  TORCH_CHECK_VALUE(!tensors.empty(), kOp, ": expected at least one tensor");
  for (const auto& t : tensors) {
    check_dense(kOp, t, "tensor");
    check_same_type(kOp, tensors[0], t, "a tensor");
  }
  const ReduceKind rk = to_reduce(kOp, opts.reduceOp, tensors[0].scalar_type());
  const std::vector<at::Tensor> ts = tensors;
  OpCall call =
      new_call(c10d::OpType::ALLREDUCE_COALESCED, OpCode::AllReduce, kOp, "allreduce_coalesced", ts[0], opts.asyncOp);
  call.tensors = call.outputs = ts;
  call.premul_factor = rk == ReduceKind::PremulSum ? premul_factor(opts.reduceOp) : at::Tensor();
  call.logged_bytes = total_bytes(ts);
  call.prepare = [ts, rk] {
    at::Tensor flat = flat_cat(ts);
    return std::vector<Collective>{engine_call(OpCode::AllReduce, flat, flat, rk)};
  };
  call.finish = [ts](const std::vector<Collective>& p) { split_into(p[0].output, ts); };
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::allgather_coalesced";
  TORCH_CHECK_VALUE(output_lists.size() == static_cast<size_t>(size_), kOp, ": expected ", size_,
                    " output lists (one per rank), got ", output_lists.size());
  for (const auto& in : inputs) {
    check_dense(kOp, in, "input");
  }
  for (const auto& list : output_lists) {
    TORCH_CHECK_VALUE(list.size() == inputs.size(), kOp, ": each output list must have ", inputs.size(),
                      " tensors, got ", list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      check_dense(kOp, list[i], "output");
      check_same_type(kOp, inputs[i], list[i], "an output tensor");
      TORCH_CHECK_VALUE(list[i].numel() == inputs[i].numel(), kOp, ": output ", i, " has ", list[i].numel(),
                        " elements, input has ", inputs[i].numel());
    }
  }
  if (inputs.empty()) return nothing_to_do(c10d::OpType::ALLGATHER_COALESCED, kOp);
  const std::vector<at::Tensor> ins = inputs;
  const auto lists = output_lists;
  OpCall call =
      new_call(c10d::OpType::ALLGATHER_COALESCED, OpCode::AllGather, kOp, "allgather_coalesced", ins[0], opts.asyncOp);
  for (const auto& l : lists) call.outputs.insert(call.outputs.end(), l.begin(), l.end());
  call.tensors = call.outputs;
  call.tensors.insert(call.tensors.end(), ins.begin(), ins.end());
  call.logged_bytes = total_bytes(ins);
  const int n = size_;
  call.prepare = [ins, n] {
    std::vector<Collective> parts;
    for (const auto& in : ins)
      parts.push_back(engine_call(OpCode::AllGather, dense(in), at::empty({in.numel() * n}, in.options())));
    return parts;
  };
  call.finish = [lists](const std::vector<Collective>& p) {
    for (size_t i = 0; i < p.size(); ++i) {
      std::vector<at::Tensor> column;
      for (const auto& l : lists) column.push_back(l[i]);
      split_into(p[i].output, column);
    }
  };
  return run(std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                   std::vector<at::Tensor>& inputs,
                                                                                   const c10d::AllgatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::allgather_into_tensor_coalesced";
  check_pairs(kOp, outputs, inputs, size_, /*output_is_bigger=*/true);
  if (inputs.empty()) return nothing_to_do(c10d::OpType::COALESCED, kOp);
  return run(pairwise_call(c10d::OpType::COALESCED, OpCode::AllGather, kOp, "allgather_coalesced", inputs, outputs, {},
                           opts.asyncOp));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "pycoll::reduce_scatter_tensor_coalesced";
  check_pairs(kOp, outputs, inputs, size_, /*output_is_bigger=*/false);
  if (inputs.empty()) return nothing_to_do(c10d::OpType::COALESCED, kOp);
  std::vector<ReduceKind> kinds;  // the tensors may differ in dtype
  for (const auto& in : inputs) kinds.push_back(to_reduce(kOp, opts.reduceOp, in.scalar_type()));
  OpCall call = pairwise_call(c10d::OpType::COALESCED, OpCode::ReduceScatter, kOp, "reduce_scatter_coalesced", inputs,
                              outputs, kinds, opts.asyncOp);
  if (kinds[0] == ReduceKind::PremulSum) call.premul_factor = premul_factor(opts.reduceOp);
  return run(std::move(call));
}

}  // namespace pycoll

// Small pieces the entry points share when they build an OpCall.
#pragma once

#include <algorithm>

#include <ATen/ATen.h>

#include <vector>

#include "backend/op_call.h"
#include "backend/settings.h"

namespace pycoll {

// A contiguous tensor holding t's values (t itself when already contiguous).
inline at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Copies the result back when the op had to work on a contiguous copy (or on the host). Outside
// autograd, as a kernel's write: a pipeline stage receives into leaves that require grad.
inline void write_back(const at::Tensor& user, const at::Tensor& buf) {
  if (!user.defined() || !buf.defined() || user.is_same(buf)) return;
  const at::NoGradGuard no_grad;
  user.copy_(buf);
}

// The user's tensors (any shape, same dtype) as one flat, contiguous tensor.
inline at::Tensor flat_cat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// Copies consecutive pieces of flat (numel() of each target) into the targets.
inline void split_into(const at::Tensor& flat, const std::vector<at::Tensor>& targets) {
  int64_t off = 0;
  for (const auto& t : targets) {
    t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
}

// Uneven all_gather and reduce_scatter (NCCL's all_gather_v / reduce_scatter_v, as torch offers them
// on NCCL: one tensor per rank, rank r's of its own size): every rank's block is padded to the
// largest, so that the even collective carries them, block r at r * row.
inline int64_t largest_numel(const std::vector<at::Tensor>& ts) {
  int64_t most = 0;
  for (const auto& t : ts) most = std::max(most, t.numel());
  return most;
}

// The tensors as rows of `row` elements, zero-padded, in one flat tensor.
inline at::Tensor padded_rows(const std::vector<at::Tensor>& ts, int64_t row) {
  at::Tensor flat = at::zeros({static_cast<int64_t>(ts.size()) * row}, ts[0].options());
  for (size_t r = 0; r < ts.size(); ++r) {
    flat.narrow(0, static_cast<int64_t>(r) * row, ts[r].numel()).copy_(ts[r].reshape({-1}));
  }
  return flat;
}

// The first numel() elements of each row into the targets.
inline void unpad_rows(const at::Tensor& flat, int64_t row, const std::vector<at::Tensor>& targets) {
  for (size_t r = 0; r < targets.size(); ++r) {
    const auto& t = targets[r];
    t.copy_(flat.narrow(0, static_cast<int64_t>(r) * row, t.numel()).view(t.sizes()));
  }
}

// One engine call; the runner sets its algorithm from OpCall::algo.
inline Collective engine_call(OpCode op, at::Tensor in, at::Tensor out, ReduceKind rk = ReduceKind::Sum, int root = 0) {
  Collective c;
  c.op = op;
  c.input = std::move(in);
  c.output = std::move(out);
  c.reduce = rk;
  c.root = root;
  return c;
}

inline OpCall new_call(c10d::OpType type, OpCode op, const char* name, const char* stats_name, const at::Tensor& ref,
                       bool async) {
  OpCall call;
  call.type = type;
  call.op = op;
  call.name = name;
  call.stats_name = stats_name;
  call.async = async;
  call.algo = algo_override();
  if (call.algo == Algo::Schedule) call.schedule = schedule_override();
  call.device = ref.device();
  call.dtype = ref.scalar_type();
  return call;
}

}  // namespace pycoll

#include "backend/process_group.h"

#include <pybind11/pybind11.h>

#include <cstdio>
#include <cstring>
#include <tuple>
#include <utility>

#include "backend/gil_release.h"
#include "backend/op_stats.h"
#include "backend/settings.h"
#include "backend/tensor_args.h"
#include "common/check.h"
#include "common/env.h"

#ifdef PYCOLL_WITH_CUDA
#include "backend/cuda/cuda_ops.h"
#include "cuda/cuda_engine.h"
#endif

namespace pycoll {

namespace {

// Store calls take the GIL: the Store handed to a backend may be implemented
// in Python (or wrap one), and calling into it without the GIL crashes.
Rendezvous make_rendezvous(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix) {
  Rendezvous rv;
  rv.prefix = prefix;
  rv.set = [store](const std::string& k, const std::string& v) {
    pybind11::gil_scoped_acquire gil;
    store->set(k, std::vector<uint8_t>(v.begin(), v.end()));
  };
  rv.get = [store](const std::string& k) {
    pybind11::gil_scoped_acquire gil;
    auto v = store->get(k);
    return std::string(v.begin(), v.end());
  };
  rv.add = [store](const std::string& k, int64_t d) {
    pybind11::gil_scoped_acquire gil;
    return store->add(k, d);
  };
  return rv;
}

char* bytes_of(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// A contiguous tensor holding t's values (t itself when already contiguous).
at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Copies the result back when the op had to work on a contiguous copy.
void write_back(const at::Tensor& user, const at::Tensor& buf) {
  if (!user.is_same(buf)) user.copy_(buf);
}

// PREMUL_SUM is a pre-scale followed by SUM (as in NCCL): returns the tensor
// to reduce and the op the engine runs.
std::pair<at::Tensor, ReduceKind> prescaled(const at::Tensor& t, ReduceKind rk, const at::Tensor& factor) {
  if (rk != ReduceKind::PremulSum) return {t, rk};
  return {t * factor.to(t.device()), ReduceKind::Sum};
}

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.defined() ? t.to(at::kCPU) : t);
  return out;
}

}  // namespace

ProcessGroupPycoll::ProcessGroupPycoll(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout, std::string group_name)
    : c10d::Backend(rank, size), store_(store), group_name_(std::move(group_name)), timeout_(timeout) {
  cpu_ = std::make_unique<CpuEngine>(make_rendezvous(store_, "pycoll/" + group_name_ + "/cpu/"), rank, size, timeout);
  // Map the shared workspace now, while every member is in the constructor:
  // a lazy start would make a rank's first send wait for idle peers.
  cpu_->p2p();
  executor_ = std::make_unique<SerialExecutor>();
#ifdef PYCOLL_WITH_CUDA
  cuda_ = std::make_unique<CudaOps>(store_, group_name_, rank, size, timeout);
#endif
}

ProcessGroupPycoll::~ProcessGroupPycoll() {
  ReleaseGilIfHeld nogil;  // the members below join threads (gil_release.h)
  shutdown();
#ifdef PYCOLL_WITH_CUDA
  cuda_.reset();
#endif
  executor_.reset();
  cpu_.reset();
}

void ProcessGroupPycoll::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  cpu_->set_timeout(timeout);
}

void ProcessGroupPycoll::shutdown() {
  if (closed_.exchange(true)) return;
  ReleaseGilIfHeld nogil;
  executor_->stop();  // runs what is queued, then joins
}

std::vector<int64_t> ProcessGroupPycoll::cuda_trace() {
#ifdef PYCOLL_WITH_CUDA
  return cuda_->trace();
#else
  return {};
#endif
}

void ProcessGroupPycoll::abort() {
  closed_.store(true);
  cpu_->abort();
  ReleaseGilIfHeld nogil;
  executor_->stop();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::staged(c10d::OpType type, const char* op,
                                                          std::vector<at::Tensor> device_tensors,
                                                          const StagedCall& call) {
  // Host copies are taken after the caller's stream (to() synchronises), the
  // CPU engine runs the op, and the results go back on the caller's stream.
  std::vector<at::Tensor> host = to_host(device_tensors);
  call(host)->wait();
  std::vector<c10::Device> devices;
  for (size_t i = 0; i < device_tensors.size(); ++i) {
    if (!device_tensors[i].defined()) continue;
    device_tensors[i].copy_(host[i]);
    if (device_tensors[i].is_cuda() &&
        std::find(devices.begin(), devices.end(), device_tensors[i].device()) == devices.end()) {
      devices.push_back(device_tensors[i].device());
    }
  }
  auto work = c10::make_intrusive<PycollWork>(rank_, type, op, ++issued_, device_tensors, devices);
  work->mark_done(nullptr);
  work->settle_future();
  return work;
}

bool ProcessGroupPycoll::on_engine(const at::Tensor& t) {
#ifdef PYCOLL_WITH_CUDA
  if (!t.is_cuda()) return false;
  // init_process_group(device_id=...) binds the group before its first op.
  const auto bound = getBoundDeviceId();
  TORCH_CHECK_VALUE(!bound || !bound->is_cuda() || *bound == t.device(), "pycoll: wrong device: this rank's group is ",
                    "bound to ", bound ? bound->str() : std::string(), " (device_id), got a tensor on ", t.device().str());
  return cuda_->usable(t.device());
#else
  (void)t;
  return false;
#endif
}

void ProcessGroupPycoll::check_usable(const char* op) {
  TORCH_CHECK(!closed_.load(), op, ": the process group was shut down or destroyed");
  std::lock_guard<std::mutex> g(broken_mu_);
  TORCH_CHECK(broken_.empty(), op, ": the group is unusable after an earlier error: ", broken_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::launch(c10d::OpType type, const char* op,
                                                          std::vector<at::Tensor> outputs, bool async_op, Body body) {
  check_usable(op);
  std::vector<c10::Device> devices;
  for (const auto& t : outputs) {
    if (t.defined() && t.is_cuda() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  const uint64_t seq = ++issued_;
  auto work = c10::make_intrusive<PycollWork>(rank_, type, op, seq, outputs, devices);
  auto task = [this, work, op, body = std::move(body)]() {
    std::exception_ptr err;
    try {
      {
        std::lock_guard<std::mutex> g(broken_mu_);
        TORCH_CHECK(broken_.empty(), op, ": the group is unusable after an earlier error: ", broken_);
      }
      body();
    } catch (const GroupBroken& e) {
      {
        std::lock_guard<std::mutex> g(broken_mu_);
        if (broken_.empty()) broken_ = e.what();
      }
      // DistBackendError reaches Python as torch.distributed.DistBackendError (a RuntimeError).
      try {
        C10_THROW_ERROR(DistBackendError, e.what());
      } catch (...) {
        err = std::current_exception();
      }
    } catch (...) {
      err = std::current_exception();
    }
    work->mark_done(err);
    if (SerialExecutor::running_inline()) {
      work->settle_future();  // no callback can be attached yet: complete it here, no thread hand-off
    } else {
      CompletionPool::instance().post([work] { work->settle_future(); });
    }
  };
  executor_->submit(std::move(task), !async_op);
  return work;
}

// ---- collectives ----------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  static constexpr const char* kOp = "pycoll::allreduce";
  check_one_tensor(kOp, tensors);
  at::Tensor t = tensors[0];
  check_dense(kOp, t, "tensor");
  const DType dt = to_dtype(kOp, t.scalar_type());
  ReduceKind rk = to_reduce(kOp, opts.reduceOp, dt);
  at::Tensor factor = rk == ReduceKind::PremulSum ? premul_factor(opts.reduceOp) : at::Tensor();
#ifdef PYCOLL_WITH_CUDA
  if (on_engine(t)) {
    check_usable(kOp);
    return cuda_->launch(c10d::OpType::ALLREDUCE, kOp, ++issued_, {t}, {t}, opts.asyncOp,
                         [this, t, rk, factor](CudaEngine& e, cudaStream_t s) {
                           at::Tensor buf = dense(t);
                           auto [src, k] = prescaled(buf, rk, factor);
                           OpTimer timer;
                           Algo a = e.all_reduce(src, buf, k, algo_override(), s);
                           write_back(t, buf);
                           record_op("allreduce", nbytes(t), a, timer, rank_, size_);
                         });
  }
#endif
  if (t.is_cuda()) {
    return staged(c10d::OpType::ALLREDUCE, kOp, {t}, [this, opts](std::vector<at::Tensor>& h) {
      c10d::AllreduceOptions o = opts;
      o.asyncOp = false;
      return allreduce(h, o);
    });
  }
  return launch(c10d::OpType::ALLREDUCE, kOp, {t}, opts.asyncOp, [this, t, dt, rk, factor]() {
    at::Tensor buf = dense(t);
    auto [src, k] = prescaled(buf, rk, factor);
    OpTimer timer;
    Algo a = cpu_->all_reduce(bytes_of(src), bytes_of(buf), buf.numel(), dt, k, algo_override());
    write_back(t, buf);
    record_op("allreduce", nbytes(t), a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  static constexpr const char* kOp = "pycoll::allreduce_coalesced";
  TORCH_CHECK_VALUE(!tensors.empty(), kOp, ": expected at least one tensor");
  for (const auto& t : tensors) {
    check_dense(kOp, t, "tensor");
    check_same_type(kOp, tensors[0], t, "a tensor");
  }
  if (tensors[0].is_cuda()) {
    // One flat buffer, one engine all-reduce, then back into the tensors.
    std::vector<at::Tensor> flat;
    for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
    std::vector<at::Tensor> one{at::cat(flat)};
    c10d::AllreduceOptions o;
    o.reduceOp = opts.reduceOp;
    o.asyncOp = opts.asyncOp;
    auto work = allreduce(one, o);
    work->wait();  // the caller's stream now waits for the result (no host block on the engine path)
    int64_t off = 0;
    for (const auto& t : tensors) {
      t.copy_(one[0].narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    return work;
  }
  const DType dt = to_dtype(kOp, tensors[0].scalar_type());
  ReduceKind rk = to_reduce(kOp, opts.reduceOp, dt);
  at::Tensor factor = rk == ReduceKind::PremulSum ? premul_factor(opts.reduceOp) : at::Tensor();
  return launch(c10d::OpType::ALLREDUCE_COALESCED, kOp, tensors, opts.asyncOp, [this, tensors, dt, rk, factor]() {
    std::vector<at::Tensor> flat;
    for (const auto& t : tensors) flat.push_back(t.reshape({-1}));
    at::Tensor buf = at::cat(flat);
    ReduceKind k;
    std::tie(buf, k) = prescaled(buf, rk, factor);
    OpTimer timer;
    Algo a = cpu_->all_reduce(bytes_of(buf), bytes_of(buf), buf.numel(), dt, k, algo_override());
    int64_t off = 0;
    for (const auto& t : tensors) {
      t.copy_(buf.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    record_op("allreduce_coalesced", nbytes(buf), a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  static constexpr const char* kOp = "pycoll::broadcast";
  check_one_tensor(kOp, tensors);
  check_rank(kOp, opts.rootRank, size_, "root rank");
  TORCH_CHECK_VALUE(opts.rootTensor == 0, kOp, ": rootTensor must be 0, got ", opts.rootTensor);
  at::Tensor t = tensors[0];
  check_dense(kOp, t, "tensor");
  const DType dt = to_dtype(kOp, t.scalar_type());
  const int root = static_cast<int>(opts.rootRank);
#ifdef PYCOLL_WITH_CUDA
  if (on_engine(t)) {
    check_usable(kOp);
    return cuda_->launch(c10d::OpType::BROADCAST, kOp, ++issued_, {t}, {t}, opts.asyncOp,
                         [this, t, root](CudaEngine& e, cudaStream_t s) {
                           at::Tensor buf = dense(t);
                           OpTimer timer;
                           e.broadcast(buf, root, s);
                           if (rank_ != root) write_back(t, buf);
                           record_op("broadcast", rank_ == root ? nbytes(t) : 0, Algo::OneShot, timer, rank_, size_);
                         });
  }
#endif
  if (t.is_cuda()) {
    return staged(c10d::OpType::BROADCAST, kOp, {t}, [this, opts](std::vector<at::Tensor>& h) {
      c10d::BroadcastOptions o = opts;
      o.asyncOp = false;
      return broadcast(h, o);
    });
  }
  return launch(c10d::OpType::BROADCAST, kOp, {t}, opts.asyncOp, [this, t, dt, root]() {
    at::Tensor buf = dense(t);
    OpTimer timer;
    Algo a = cpu_->broadcast(bytes_of(buf), buf.numel(), dt, root, algo_override());
    if (rank_ != root) write_back(t, buf);
    record_op("broadcast", rank_ == root ? nbytes(t) : 0, a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  static constexpr const char* kOp = "pycoll::reduce";
  check_one_tensor(kOp, tensors);
  check_rank(kOp, opts.rootRank, size_, "root rank");
  at::Tensor t = tensors[0];
  check_dense(kOp, t, "tensor");
  const DType dt = to_dtype(kOp, t.scalar_type());
  ReduceKind rk = to_reduce(kOp, opts.reduceOp, dt);
  at::Tensor factor = rk == ReduceKind::PremulSum ? premul_factor(opts.reduceOp) : at::Tensor();
  const int root = static_cast<int>(opts.rootRank);
#ifdef PYCOLL_WITH_CUDA
  if (on_engine(t)) {
    check_usable(kOp);
    return cuda_->launch(c10d::OpType::REDUCE, kOp, ++issued_, {t}, {t}, opts.asyncOp,
                         [this, t, rk, factor, root](CudaEngine& e, cudaStream_t s) {
                           at::Tensor buf = dense(t);
                           auto [src, k] = prescaled(buf, rk, factor);
                           OpTimer timer;
                           e.reduce(src, buf, root, k, s);
                           if (rank_ == root) write_back(t, buf);
                           record_op("reduce", nbytes(t), Algo::OneShot, timer, rank_, size_);
                         });
  }
#endif
  if (t.is_cuda()) {
    return staged(c10d::OpType::REDUCE, kOp, {t}, [this, opts](std::vector<at::Tensor>& h) {
      c10d::ReduceOptions o = opts;
      o.asyncOp = false;
      return reduce(h, o);
    });
  }
  return launch(c10d::OpType::REDUCE, kOp, {t}, opts.asyncOp, [this, t, dt, rk, factor, root]() {
    at::Tensor buf = dense(t);
    auto [src, k] = prescaled(buf, rk, factor);
    OpTimer timer;
    Algo a = cpu_->reduce(bytes_of(src), bytes_of(buf), buf.numel(), dt, k, root, algo_override());
    if (rank_ == root) write_back(t, buf);
    record_op("reduce", nbytes(t), a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::allgather";
  check_one_tensor(kOp, inputs);
  TORCH_CHECK_VALUE(outputs.size() == 1, kOp, ": expected one output list, got ", outputs.size());
  at::Tensor in = inputs[0];
  check_dense(kOp, in, "input");
  std::vector<at::Tensor> outs = outputs[0];
  TORCH_CHECK_VALUE(static_cast<int>(outs.size()) == size_, kOp, ": the output list has ", outs.size(),
                    " tensors but the group has ", size_, " ranks");
  for (const auto& o : outs) {
    check_dense(kOp, o, "output");
    check_same_type(kOp, in, o, "an output tensor");
    TORCH_CHECK_VALUE(o.numel() == in.numel(), kOp, ": an output tensor has ", o.numel(),
                      " elements but the input has ", in.numel());
  }
  const DType dt = to_dtype(kOp, in.scalar_type());
  if (in.is_cuda()) {
    // Gather into one flat tensor (engine or staged), then split on the caller's stream.
    at::Tensor flat = at::empty({in.numel() * size_}, in.options());
    at::Tensor src = in.reshape({-1});
    c10d::AllgatherOptions o = opts;
    auto work = _allgather_base(flat, src, o);
    work->wait();
    for (int r = 0; r < size_; ++r) outs[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(outs[r].sizes()));
    return work;
  }
  return launch(c10d::OpType::ALLGATHER, kOp, outs, opts.asyncOp, [this, in, outs, dt]() {
    at::Tensor src = dense(in);
    at::Tensor flat = at::empty({in.numel() * size_}, in.options());
    OpTimer timer;
    Algo a = cpu_->all_gather(bytes_of(src), bytes_of(flat), in.numel(), dt, algo_override());
    for (int r = 0; r < size_; ++r) outs[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(outs[r].sizes()));
    record_op("allgather", nbytes(in), a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::allgather_into_tensor";
  check_dense(kOp, input, "input");
  check_dense(kOp, output, "output");
  check_same_type(kOp, input, output, "the output");
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, kOp, ": the output has ", output.numel(),
                    " elements but must have world_size * input = ", input.numel() * size_);
  const DType dt = to_dtype(kOp, input.scalar_type());
  at::Tensor in = input, out = output;
#ifdef PYCOLL_WITH_CUDA
  if (on_engine(in)) {
    check_usable(kOp);
    return cuda_->launch(c10d::OpType::_ALLGATHER_BASE, kOp, ++issued_, {in, out}, {out}, opts.asyncOp,
                         [this, in, out](CudaEngine& e, cudaStream_t s) {
                           at::Tensor src = dense(in);
                           at::Tensor dst = dense(out);
                           OpTimer timer;
                           Algo a = e.all_gather(src, dst, algo_override(), s);
                           write_back(out, dst);
                           record_op("allgather", nbytes(in), a, timer, rank_, size_);
                         });
  }
#endif
  if (in.is_cuda()) {
    return staged(c10d::OpType::_ALLGATHER_BASE, kOp, {out, in}, [this, opts](std::vector<at::Tensor>& h) {
      c10d::AllgatherOptions o = opts;
      o.asyncOp = false;
      return _allgather_base(h[0], h[1], o);
    });
  }
  return launch(c10d::OpType::_ALLGATHER_BASE, kOp, {out}, opts.asyncOp, [this, in, out, dt]() {
    at::Tensor src = dense(in);
    at::Tensor dst = dense(out);
    OpTimer timer;
    Algo a = cpu_->all_gather(bytes_of(src), bytes_of(dst), in.numel(), dt, algo_override());
    write_back(out, dst);
    record_op("allgather", nbytes(in), a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::allgather_coalesced";
  TORCH_CHECK_VALUE(output_lists.size() == static_cast<size_t>(size_), kOp, ": expected ", size_,
                    " output lists (one per rank), got ", output_lists.size());
  for (const auto& list : output_lists) {
    TORCH_CHECK_VALUE(list.size() == inputs.size(), kOp, ": each output list must have ", inputs.size(),
                      " tensors, got ", list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      check_same_type(kOp, inputs[i], list[i], "an output tensor");
      TORCH_CHECK_VALUE(list[i].numel() == inputs[i].numel(), kOp, ": output ", i, " has ", list[i].numel(),
                        " elements, input has ", inputs[i].numel());
    }
  }
  for (const auto& in : inputs) {
    check_dense(kOp, in, "input");
    to_dtype(kOp, in.scalar_type());
  }
  if (!inputs.empty() && inputs[0].is_cuda()) {
    std::vector<at::Tensor> all = inputs;
    for (const auto& l : output_lists) all.insert(all.end(), l.begin(), l.end());
    const size_t k = inputs.size();
    return staged(c10d::OpType::ALLGATHER_COALESCED, kOp, all, [this, opts, k](std::vector<at::Tensor>& h) {
      std::vector<at::Tensor> ins(h.begin(), h.begin() + k);
      std::vector<std::vector<at::Tensor>> lists;
      for (int r = 0; r < size_; ++r) lists.emplace_back(h.begin() + k + r * k, h.begin() + k + (r + 1) * k);
      c10d::AllgatherOptions o = opts;
      o.asyncOp = false;
      return allgather_coalesced(lists, ins, o);
    });
  }
  std::vector<at::Tensor> all_outs;
  for (const auto& l : output_lists) all_outs.insert(all_outs.end(), l.begin(), l.end());
  auto lists = output_lists;
  auto ins = inputs;
  return launch(c10d::OpType::ALLGATHER_COALESCED, kOp, all_outs, opts.asyncOp, [this, lists, ins]() {
    OpTimer timer;
    Algo a = Algo::OneShot;
    int64_t total = 0;
    for (size_t i = 0; i < ins.size(); ++i) {
      at::Tensor src = dense(ins[i]);
      at::Tensor flat = at::empty({src.numel() * size_}, src.options());
      a = cpu_->all_gather(bytes_of(src), bytes_of(flat), src.numel(), to_dtype(kOp, src.scalar_type()),
                           algo_override());
      for (int r = 0; r < size_; ++r) {
        lists[r][i].copy_(flat.narrow(0, r * src.numel(), src.numel()).view(lists[r][i].sizes()));
      }
      total += nbytes(src);
    }
    record_op("allgather_coalesced", total, a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::allgather_into_tensor_coalesced";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), kOp, ": got ", outputs.size(), " outputs for ", inputs.size(),
                    " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_dense(kOp, inputs[i], "input");
    check_dense(kOp, outputs[i], "output");
    check_same_type(kOp, inputs[i], outputs[i], "an output");
    to_dtype(kOp, inputs[i].scalar_type());
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_, kOp, ": output ", i, " has ",
                      outputs[i].numel(), " elements but must have world_size * input = ", inputs[i].numel() * size_);
  }
  auto outs = outputs;
  auto ins = inputs;
  if (!ins.empty() && ins[0].is_cuda()) {
    c10::intrusive_ptr<c10d::Work> work;
    for (size_t i = 0; i < ins.size(); ++i) work = _allgather_base(outs[i], ins[i], opts);
    return work;
  }
  return launch(c10d::OpType::COALESCED, kOp, outs, opts.asyncOp, [this, outs, ins]() {
    OpTimer timer;
    Algo a = Algo::OneShot;
    int64_t total = 0;
    for (size_t i = 0; i < ins.size(); ++i) {
      at::Tensor src = dense(ins[i]);
      at::Tensor dst = dense(outs[i]);
      a = cpu_->all_gather(bytes_of(src), bytes_of(dst), src.numel(), to_dtype(kOp, src.scalar_type()),
                           algo_override());
      write_back(outs[i], dst);
      total += nbytes(src);
    }
    record_op("allgather_coalesced", total, a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  static constexpr const char* kOp = "pycoll::gather";
  check_one_tensor(kOp, inputs);
  check_rank(kOp, opts.rootRank, size_, "root rank");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor in = inputs[0];
  check_dense(kOp, in, "input");
  std::vector<at::Tensor> outs;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, kOp,
                      ": the root needs one output list of ", size_, " tensors");
    outs = outputs[0];
    for (const auto& o : outs) {
      check_same_type(kOp, in, o, "an output tensor");
      TORCH_CHECK_VALUE(o.numel() == in.numel(), kOp, ": an output tensor has ", o.numel(),
                        " elements but the input has ", in.numel());
    }
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), kOp,
                      ": only the root (rank ", root, ") takes output tensors");
  }
  const DType dt = to_dtype(kOp, in.scalar_type());
  if (in.is_cuda()) {
    std::vector<at::Tensor> all{in};
    all.insert(all.end(), outs.begin(), outs.end());
    return staged(c10d::OpType::GATHER, kOp, all, [this, opts](std::vector<at::Tensor>& h) {
      std::vector<at::Tensor> i{h[0]};
      std::vector<std::vector<at::Tensor>> o;
      if (h.size() > 1) o.emplace_back(h.begin() + 1, h.end());
      c10d::GatherOptions g = opts;
      g.asyncOp = false;
      return gather(o, i, g);
    });
  }
  return launch(c10d::OpType::GATHER, kOp, outs, opts.asyncOp, [this, in, outs, dt, root]() {
    at::Tensor src = dense(in);
    at::Tensor flat = rank_ == root ? at::empty({in.numel() * size_}, in.options()) : at::Tensor();
    OpTimer timer;
    cpu_->gather(bytes_of(src), rank_ == root ? bytes_of(flat) : nullptr, in.numel(), dt, root);
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) outs[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(outs[r].sizes()));
    }
    record_op("gather", nbytes(in), Algo::OneShot, timer, rank_, size_);
  });
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
  at::Tensor out = outputs[0];
  check_dense(kOp, out, "output");
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, kOp,
                      ": the root needs one input list of ", size_, " tensors");
    ins = inputs[0];
    for (const auto& i : ins) {
      check_same_type(kOp, out, i, "an input tensor");
      TORCH_CHECK_VALUE(i.numel() == out.numel(), kOp, ": an input tensor has ", i.numel(),
                        " elements but the output has ", out.numel());
    }
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), kOp,
                      ": only the root (rank ", root, ") takes input tensors");
  }
  const DType dt = to_dtype(kOp, out.scalar_type());
  if (out.is_cuda()) {
    std::vector<at::Tensor> all{out};
    all.insert(all.end(), ins.begin(), ins.end());
    return staged(c10d::OpType::SCATTER, kOp, all, [this, opts](std::vector<at::Tensor>& h) {
      std::vector<at::Tensor> o{h[0]};
      std::vector<std::vector<at::Tensor>> i;
      if (h.size() > 1) i.emplace_back(h.begin() + 1, h.end());
      c10d::ScatterOptions sc = opts;
      sc.asyncOp = false;
      return scatter(o, i, sc);
    });
  }
  return launch(c10d::OpType::SCATTER, kOp, {out}, opts.asyncOp, [this, out, ins, dt, root]() {
    at::Tensor flat;
    if (rank_ == root) {
      std::vector<at::Tensor> parts;
      for (const auto& i : ins) parts.push_back(i.reshape({-1}));
      flat = at::cat(parts);
    }
    at::Tensor dst = dense(out);
    OpTimer timer;
    cpu_->scatter(rank_ == root ? bytes_of(flat) : nullptr, bytes_of(dst), out.numel(), dt, root);
    write_back(out, dst);
    record_op("scatter", rank_ == root ? nbytes(flat) : 0, Algo::OneShot, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "pycoll::reduce_scatter";
  check_one_tensor(kOp, outputs);
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, kOp,
                    ": expected one input list of ", size_, " tensors");
  at::Tensor out = outputs[0];
  check_dense(kOp, out, "output");
  for (const auto& i : inputs[0]) {
    check_dense(kOp, i, "input");
    check_same_type(kOp, out, i, "an input tensor");
    TORCH_CHECK_VALUE(i.numel() == out.numel(), kOp, ": an input tensor has ", i.numel(),
                      " elements but the output has ", out.numel());
  }
  const DType dt = to_dtype(kOp, out.scalar_type());
  ReduceKind rk = to_reduce(kOp, opts.reduceOp, dt);
  at::Tensor factor = rk == ReduceKind::PremulSum ? premul_factor(opts.reduceOp) : at::Tensor();
  auto ins = inputs[0];
  if (out.is_cuda()) {
    std::vector<at::Tensor> parts;
    for (const auto& i : ins) parts.push_back(i.reshape({-1}));
    at::Tensor flat = at::cat(parts);
    at::Tensor o = out.is_contiguous() ? out.view({-1}) : at::empty({out.numel()}, out.options());
    auto work = _reduce_scatter_base(o, flat, opts);
    if (!o.is_same(out) && o.data_ptr() != out.data_ptr()) {
      work->wait();
      out.copy_(o.view(out.sizes()));
    }
    return work;
  }
  return launch(c10d::OpType::REDUCE_SCATTER, kOp, {out}, opts.asyncOp, [this, out, ins, dt, rk, factor]() {
    std::vector<at::Tensor> parts;
    for (const auto& i : ins) parts.push_back(i.reshape({-1}));
    at::Tensor flat = at::cat(parts);
    ReduceKind k;
    std::tie(flat, k) = prescaled(flat, rk, factor);
    at::Tensor dst = dense(out);
    OpTimer timer;
    Algo a = cpu_->reduce_scatter(bytes_of(flat), bytes_of(dst), out.numel(), dt, k, algo_override());
    write_back(out, dst);
    record_op("reduce_scatter", nbytes(flat), a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "pycoll::reduce_scatter_tensor";
  check_dense(kOp, input, "input");
  check_dense(kOp, output, "output");
  check_same_type(kOp, input, output, "the output");
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, kOp, ": the input has ", input.numel(),
                    " elements but must have world_size * output = ", output.numel() * size_);
  const DType dt = to_dtype(kOp, input.scalar_type());
  ReduceKind rk = to_reduce(kOp, opts.reduceOp, dt);
  at::Tensor factor = rk == ReduceKind::PremulSum ? premul_factor(opts.reduceOp) : at::Tensor();
  at::Tensor in = input, out = output;
#ifdef PYCOLL_WITH_CUDA
  if (on_engine(in)) {
    check_usable(kOp);
    return cuda_->launch(c10d::OpType::_REDUCE_SCATTER_BASE, kOp, ++issued_, {in, out}, {out}, opts.asyncOp,
                         [this, in, out, rk, factor](CudaEngine& e, cudaStream_t s) {
                           at::Tensor src = dense(in);
                           ReduceKind k;
      std::tie(src, k) = prescaled(src, rk, factor);
                           at::Tensor dst = dense(out);
                           OpTimer timer;
                           Algo a = e.reduce_scatter(src, dst, k, algo_override(), s);
                           write_back(out, dst);
                           record_op("reduce_scatter", nbytes(in), a, timer, rank_, size_);
                         });
  }
#endif
  if (in.is_cuda()) {
    return staged(c10d::OpType::_REDUCE_SCATTER_BASE, kOp, {out, in}, [this, opts](std::vector<at::Tensor>& h) {
      c10d::ReduceScatterOptions o = opts;
      o.asyncOp = false;
      return _reduce_scatter_base(h[0], h[1], o);
    });
  }
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, kOp, {out}, opts.asyncOp, [this, in, out, dt, rk, factor]() {
    at::Tensor src = dense(in);
    ReduceKind k;
      std::tie(src, k) = prescaled(src, rk, factor);
    at::Tensor dst = dense(out);
    OpTimer timer;
    Algo a = cpu_->reduce_scatter(bytes_of(src), bytes_of(dst), out.numel(), dt, k, algo_override());
    write_back(out, dst);
    record_op("reduce_scatter", nbytes(in), a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  static constexpr const char* kOp = "pycoll::reduce_scatter_tensor_coalesced";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), kOp, ": got ", outputs.size(), " outputs for ", inputs.size(),
                    " inputs");
  std::vector<ReduceKind> kinds;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_dense(kOp, inputs[i], "input");
    check_dense(kOp, outputs[i], "output");
    check_same_type(kOp, inputs[i], outputs[i], "an output");
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_, kOp, ": input ", i, " has ",
                      inputs[i].numel(), " elements but must have world_size * output = ", outputs[i].numel() * size_);
    kinds.push_back(to_reduce(kOp, opts.reduceOp, to_dtype(kOp, inputs[i].scalar_type())));
  }
  at::Tensor factor = (!kinds.empty() && kinds[0] == ReduceKind::PremulSum) ? premul_factor(opts.reduceOp) : at::Tensor();
  auto outs = outputs;
  auto ins = inputs;
  if (!ins.empty() && ins[0].is_cuda()) {
    c10::intrusive_ptr<c10d::Work> work;
    for (size_t i = 0; i < ins.size(); ++i) work = _reduce_scatter_base(outs[i], ins[i], opts);
    return work;
  }
  return launch(c10d::OpType::COALESCED, kOp, outs, opts.asyncOp, [this, outs, ins, kinds, factor]() {
    OpTimer timer;
    Algo a = Algo::OneShot;
    int64_t total = 0;
    for (size_t i = 0; i < ins.size(); ++i) {
      at::Tensor src = dense(ins[i]);
      ReduceKind k;
      std::tie(src, k) = prescaled(src, kinds[i], factor);
      at::Tensor dst = dense(outs[i]);
      a = cpu_->reduce_scatter(bytes_of(src), bytes_of(dst), outs[i].numel(), to_dtype(kOp, src.scalar_type()), k,
                               algo_override());
      write_back(outs[i], dst);
      total += nbytes(src);
    }
    record_op("reduce_scatter_coalesced", total, a, timer, rank_, size_);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions& opts) {
  static constexpr const char* kOp = "pycoll::alltoall_base";
  check_dense(kOp, input, "input");
  check_dense(kOp, output, "output");
  check_same_type(kOp, input, output, "the output");
  const DType dt = to_dtype(kOp, input.scalar_type());
  // Splits count rows of dim 0; empty splits mean equal parts.
  auto byte_splits = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const int64_t row_bytes = rows == 0 ? 0 : nbytes(t) / rows;
    std::vector<int64_t> bytes(size_), offs(size_);
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % size_ == 0, kOp, ": ", what, " has ", rows, " rows, not divisible by world size ", size_,
                        " (pass split sizes)");
      for (int r = 0; r < size_; ++r) bytes[r] = rows / size_ * row_bytes;
    } else {
      TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size_, kOp, ": ", what, " split sizes have ", splits.size(),
                        " entries for ", size_, " ranks");
      int64_t sum = 0;
      for (int r = 0; r < size_; ++r) {
        TORCH_CHECK_VALUE(splits[r] >= 0, kOp, ": negative split size ", splits[r]);
        sum += splits[r];
        bytes[r] = splits[r] * row_bytes;
      }
      TORCH_CHECK_VALUE(sum == rows, kOp, ": ", what, " split sizes add up to ", sum, " but dim 0 has ", rows, " rows");
    }
    int64_t off = 0;
    for (int r = 0; r < size_; ++r) {
      offs[r] = off;
      off += bytes[r];
    }
    return std::make_pair(bytes, offs);
  };
  auto [send_bytes, send_off] = byte_splits(input, input_splits, "input");
  auto [recv_bytes, recv_off] = byte_splits(output, output_splits, "output");
  at::Tensor in = input, out = output;
#ifdef PYCOLL_WITH_CUDA
  if (on_engine(in)) {
    check_usable(kOp);
    return cuda_->launch(c10d::OpType::ALLTOALL_BASE, kOp, ++issued_, {in, out}, {out}, opts.asyncOp,
                         [this, in, out, send_bytes = send_bytes, send_off = send_off, recv_bytes = recv_bytes,
                          recv_off = recv_off](CudaEngine& e, cudaStream_t s) {
                           at::Tensor src = dense(in);
                           at::Tensor dst = dense(out);
                           OpTimer timer;
                           e.all_to_all(src, dst, send_bytes, send_off, recv_bytes, recv_off, s);
                           write_back(out, dst);
                           record_op("alltoall", nbytes(in), Algo::OneShot, timer, rank_, size_);
                         });
  }
#endif
  if (in.is_cuda()) {
    std::vector<int64_t> os = output_splits, is = input_splits;
    return staged(c10d::OpType::ALLTOALL_BASE, kOp, {out, in}, [this, opts, os, is](std::vector<at::Tensor>& h) mutable {
      c10d::AllToAllOptions o = opts;
      o.asyncOp = false;
      return alltoall_base(h[0], h[1], os, is, o);
    });
  }
  return launch(c10d::OpType::ALLTOALL_BASE, kOp, {out}, opts.asyncOp,
                [this, in, out, dt, send_bytes = send_bytes, send_off = send_off, recv_bytes = recv_bytes,
                 recv_off = recv_off]() {
                  at::Tensor src = dense(in);
                  at::Tensor dst = dense(out);
                  OpTimer timer;
                  cpu_->all_to_all(bytes_of(src), bytes_of(dst), send_bytes, send_off, recv_bytes, recv_off, dt);
                  write_back(out, dst);
                  record_op("alltoall", nbytes(in), Algo::OneShot, timer, rank_, size_);
                });
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
  if (inputs[0].is_cuda()) {
    std::vector<at::Tensor> all = inputs;
    all.insert(all.end(), outputs.begin(), outputs.end());
    return staged(c10d::OpType::ALLTOALL, kOp, all, [this, opts](std::vector<at::Tensor>& h) {
      std::vector<at::Tensor> i(h.begin(), h.begin() + size_), o(h.begin() + size_, h.end());
      c10d::AllToAllOptions a = opts;
      a.asyncOp = false;
      return alltoall(o, i, a);
    });
  }
  const DType dt = to_dtype(kOp, inputs[0].scalar_type());
  std::vector<int64_t> send_bytes(size_), send_off(size_), recv_bytes(size_), recv_off(size_);
  int64_t so = 0, ro = 0;
  for (int r = 0; r < size_; ++r) {
    send_bytes[r] = nbytes(inputs[r]);
    send_off[r] = so;
    so += send_bytes[r];
    recv_bytes[r] = nbytes(outputs[r]);
    recv_off[r] = ro;
    ro += recv_bytes[r];
  }
  auto ins = inputs;
  auto outs = outputs;
  return launch(c10d::OpType::ALLTOALL, kOp, outs, opts.asyncOp,
                [this, ins, outs, dt, send_bytes, send_off, recv_bytes, recv_off, so, ro]() {
                  std::vector<at::Tensor> parts;
                  for (const auto& i : ins) parts.push_back(i.reshape({-1}));
                  at::Tensor src = at::cat(parts);
                  at::Tensor dst = at::empty({ro / static_cast<int64_t>(src.element_size())}, src.options());
                  OpTimer timer;
                  cpu_->all_to_all(bytes_of(src), bytes_of(dst), send_bytes, send_off, recv_bytes, recv_off, dt);
                  const int64_t E = src.element_size();
                  for (int r = 0; r < size_; ++r) {
                    outs[r].copy_(dst.narrow(0, recv_off[r] / E, recv_bytes[r] / E).view(outs[r].sizes()));
                  }
                  record_op("alltoall", so, Algo::OneShot, timer, rank_, size_);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::barrier(const c10d::BarrierOptions& opts) {
  static constexpr const char* kOp = "pycoll::barrier";
  return launch(c10d::OpType::BARRIER, kOp, {}, opts.asyncOp, [this]() {
    OpTimer timer;
    cpu_->barrier();
    record_op("barrier", 0, Algo::OneShot, timer, rank_, size_);
  });
}

void ProcessGroupPycoll::monitoredBarrier(const c10d::BarrierOptions& opts, bool /*wait_all_ranks*/) {
  auto work = barrier(opts);
  work->wait(opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout);
}

// ---- point-to-point -------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  static constexpr const char* kOp = "pycoll::send";
  check_one_tensor(kOp, tensors);
  check_rank(kOp, dst, size_, "destination rank");
  at::Tensor t = tensors[0];
  check_dense(kOp, t, "tensor");
  check_usable(kOp);
  if (dst == rank_) return self_p2p_.send(t, tag, ++issued_);
#ifdef PYCOLL_WITH_CUDA
  if (on_engine(t)) {
    return cuda_->launch(
        c10d::OpType::SEND, kOp, ++issued_, {t}, {t}, /*async_op=*/true,
        [this, t, dst](CudaEngine& e, cudaStream_t s) {
          e.send(dense(t), dst, s);
          record_op("send", nbytes(t), Algo::OneShot, OpTimer(), -1, size_);
        },
        CudaOps::Lane::Send);
  }
#endif
  if (t.is_cuda()) {
    return staged(c10d::OpType::SEND, kOp, {t}, [this, dst, tag](std::vector<at::Tensor>& h) {
      return send(h, dst, tag);
    });
  }
  at::Tensor buf = t.contiguous();
  if (buf.is_same(t)) buf = t;  // the caller must not modify t before wait(), as with every backend
  const uint64_t seq = ++issued_;
  auto work = c10::make_intrusive<PycollWork>(rank_, c10d::OpType::SEND, kOp, seq, std::vector<at::Tensor>{t},
                                              std::vector<c10::Device>{});
  record_op("send", nbytes(t), Algo::OneShot, OpTimer(), -1, size_);
  cpu_->p2p().post_send(dst, tag, bytes_of(buf), nbytes(buf), [work, buf](std::exception_ptr err) {
    work->mark_done(err);
    CompletionPool::instance().post([work] { work->settle_future(); });
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  static constexpr const char* kOp = "pycoll::recv";
  check_one_tensor(kOp, tensors);
  check_rank(kOp, src, size_, "source rank");
  at::Tensor t = tensors[0];
  check_dense(kOp, t, "tensor");
  check_usable(kOp);
  if (src == rank_) return self_p2p_.recv(t, tag, ++issued_);
#ifdef PYCOLL_WITH_CUDA
  if (on_engine(t)) {
    return cuda_->launch(
        c10d::OpType::RECV, kOp, ++issued_, {t}, {t}, /*async_op=*/true,
        [t, src](CudaEngine& e, cudaStream_t s) {
          at::Tensor buf = dense(t);
          e.recv(buf, src, s);
          write_back(t, buf);
        },
        CudaOps::Lane::Recv);
  }
#endif
  if (t.is_cuda()) {
    return staged(c10d::OpType::RECV, kOp, {t}, [this, src, tag](std::vector<at::Tensor>& h) {
      return recv(h, src, tag);
    });
  }
  at::Tensor buf = t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
  const uint64_t seq = ++issued_;
  auto work = c10::make_intrusive<PycollWork>(rank_, c10d::OpType::RECV, kOp, seq, std::vector<at::Tensor>{t},
                                              std::vector<c10::Device>{});
  cpu_->p2p().post_recv(src, tag, bytes_of(buf), nbytes(buf), [work, buf, t](std::exception_ptr err) {
    if (!err && !buf.is_same(t)) {
      try {
        t.copy_(buf);
      } catch (...) {
        err = std::current_exception();
      }
    }
    work->mark_done(err);
    CompletionPool::instance().post([work] { work->settle_future(); });
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::recvAnysource(std::vector<at::Tensor>& /*tensors*/, int /*tag*/) {
  TORCH_CHECK(false, "pycoll::recv: receiving from any source is not supported; pass src=");
}

}  // namespace pycoll

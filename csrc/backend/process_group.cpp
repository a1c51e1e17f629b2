#include "backend/process_group.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "cpu/lane_pool.h"
#include "backend/dump_watcher.h"
#include "backend/gil_release.h"
#include "backend/op_call_helpers.h"
#include "backend/op_stats.h"
#include "backend/store_rendezvous.h"
#include "common/check.h"
#include "common/env.h"
#include "common/setting.h"
#include "common/issuing_op.h"
#include "engines/cpu_tensor_engine.h"
#include "engines/hierarchical_engine.h"
#include "engines/staged_engine.h"

namespace pycoll {

namespace {

const IntSetting kStagedCudaAsync(
    "PYCOLL_STAGED_CUDA_ASYNC", 0, 0, 1, "backend", true, Audience::Developer,
    "0: an asynchronous op of CUDA tensors that stages through host memory (ranks sharing one GPU below "
    "PYCOLL_CUDA_SAME_DEVICE_STAGED_BELOW_KIB, GPUs that cannot map each other) hands out its Future (get_future(), "
    "a DDP comm hook) once the op ran, complete, so callbacks run at once on the asking thread and collectives "
    "they issue (torch's PowerSGD hook) come in one order on every rank; Work.wait() stays asynchronous. 1: the "
    "Future completes later on a completion thread, as Gloo's. docs/decisions/0041-staged-futures-at-issue.md");

// Names as torch's flight recorder writes them ("nccl:all_reduce" there, "pycoll:all_reduce" here).
const char* recorded_name(OpCode op) {
  switch (op) {
    case OpCode::AllReduce: return "all_reduce";
    case OpCode::Reduce: return "reduce";
    case OpCode::Broadcast: return "broadcast";
    case OpCode::AllGather: return "all_gather";
    case OpCode::ReduceScatter: return "reduce_scatter";
    case OpCode::AllToAll: return "all_to_all";
    case OpCode::Gather: return "gather";
    case OpCode::Scatter: return "scatter";
    case OpCode::Barrier: return "barrier";
  }
  return "unknown";
}

c10::Stream cpu_stream() { return c10::Stream(c10::Stream::DEFAULT, at::Device(at::kCPU)); }

// The caller's current stream on the tensor's device (what a staged op's copies must follow).
c10::Stream current_stream(const at::Device& device) {
  if (device.is_cpu()) return cpu_stream();
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

// What the engines' takes() weigh: bytes that every rank has alike, so that every rank takes the
// same engine. The op's outputs, alike where an input is not (a broadcast's root, an uneven
// all_gather), unless the call says otherwise (OpCall::weighed_bytes).
int64_t weighed_bytes(const OpCall& call) {
  if (call.weighed_bytes >= 0) return call.weighed_bytes;
  if (call.direct.output.defined()) return int64_t(call.direct.output.nbytes());
  int64_t bytes = 0;
  for (const auto& t : call.outputs) bytes += int64_t(t.nbytes());
  return bytes;
}

}  // namespace

ProcessGroupPycoll::ProcessGroupPycoll(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout, std::string group_name,
                                       std::optional<HostLayout> hosts)
    : c10d::Backend(rank, size),
      store_(store),
      group_name_(std::move(group_name)),
      timeout_(timeout),
      hosts_(std::move(hosts)) {
  if (!hosts_) {
    cpu_ = std::make_unique<CpuEngine>(make_rendezvous(store_, "pycoll/" + group_name_ + "/cpu/"), rank, size, timeout);
  } else {
    // The shared-memory engine spans this host's ranks only; its Store keys (and so its segment
    // names' token) are the host's own.
    const HostLayout& h = *hosts_;
    cpu_ = std::make_unique<CpuEngine>(
        make_rendezvous(store_, "pycoll/" + group_name_ + "/cpu/host" + std::to_string(h.host_index) + "/"),
        h.local_rank(rank), h.local_size(), timeout);
  }
  // Map the shared workspace now, while every member is in the constructor:
  // a lazy start would make a rank's first send wait for idle peers.
  cpu_->p2p();
  cpu_tensors_ = std::make_unique<CpuTensorEngine>(*cpu_);
  if (hosts_) {
    hierarchical_ = std::make_unique<HierarchicalEngine>(*cpu_tensors_, *hosts_, rank, size, /*on_device=*/false);
    // CUDA tensors: the CUDA engine over this host's ranks (on its own Store keys) and NCCL between
    // hosts (device_hierarchical(); without NCCL, and for dtypes our kernels do not reduce,
    // through host memory and the CPU tensors' path).
    staged_ = std::make_unique<StagedEngine>(*hierarchical_);
    const HostLayout& h = *hosts_;
    if (h.device_flat) {
      cuda_ = make_cuda_queue(store_, group_name_ + "/host" + std::to_string(h.host_index), h.local_rank(rank),
                              h.local_size(), timeout);
    }
  } else {
    staged_ = std::make_unique<StagedEngine>(*cpu_tensors_);
    cuda_ = make_cuda_queue(store_, group_name_, rank, size, timeout);
  }
  fr_pg_id_ = FlightRecorder::get().add_group(group_name_, "", {});
  DumpWatcher::get().watch(fr_pg_id_, store_);
  // docs/decisions/0018-cpu-ops-poll-before-sleep.md
  if (cpu_to_spare_per_rank(hosts_ ? hosts_->local_size() : size)) poll_before_sleep_ = std::chrono::microseconds(50);
  staged_cuda_async_ = kStagedCudaAsync.get() != 0;
  executor_ = std::make_unique<SerialExecutor>(poll_before_sleep_);
}

ProcessGroupPycoll::~ProcessGroupPycoll() {
  ReleaseGilIfHeld nogil;  // the members below join threads (gil_release.h)
  shutdown();
  device_hierarchical_.reset();
  cuda_.reset();
  executor_.reset();
  staged_.reset();
  hierarchical_.reset();
  cpu_tensors_.reset();
  cpu_.reset();
  // The inter-host sub-groups too, still without the GIL: Gloo's destructor joins its threads,
  // and one of them may be freeing a finished op's tensor that Python has seen, which takes the
  // GIL (a rank hung so in destroy_process_group, tests/test_multihost.py, 2+1 layout).
  hosts_.reset();
}

void ProcessGroupPycoll::describe_for_recorder(const std::string& desc, const std::vector<int64_t>& global_ranks) {
  FlightRecorder& rec = FlightRecorder::get();
  rec.describe_group(fr_pg_id_, desc, global_ranks);
  global_ranks_ = global_ranks;
  if (rank_ < static_cast<int>(global_ranks.size()) && rec.process_rank() < 0) {
    // The first group (torch makes the default group first) names this process's global rank.
    rec.set_process_rank(static_cast<int>(global_ranks[rank_]), static_cast<int>(global_ranks.size()));
  }
}

FrHandle ProcessGroupPycoll::record_collective(const OpCall& call, uint64_t seq) {
  FlightRecorder& rec = FlightRecorder::get();
  if (!rec.enabled()) return {};
  const uint64_t n = ++fr_collectives_;
  const bool direct = !call.prepare && (call.direct.input.defined() || call.direct.output.defined());
  if (direct) {
    return rec.record(fr_pg_id_, seq, n, 0, recorded_name(call.op), -1, call.direct.input, call.direct.output,
                      timeout_);
  }
  return rec.record(fr_pg_id_, seq, n, 0, recorded_name(call.op), -1, call.tensors, call.outputs, timeout_,
                    /*inputs_may_hold_outputs=*/true);
}

ParamCommsCall ProcessGroupPycoll::param_comms_group(const char* op, at::ScalarType dtype, int64_t seq) const {
  ParamCommsCall c;
  c.group_name = group_name_;
  c.group_desc = getGroupDesc();
  c.rank = rank_;
  c.size = size_;
  c.op = op + (std::strncmp(op, "pycoll::", 8) == 0 ? 8 : 0);
  c.dtype = dtype;
  c.global_ranks = global_ranks_;
  c.seq = seq;
  return c;
}

ParamCommsCall ProcessGroupPycoll::param_comms_call(const OpCall& call, uint64_t seq) const {
  ParamCommsCall c = param_comms_group(call.name, call.dtype, static_cast<int64_t>(seq));
  c.async_op = call.async;
  const auto is_output = [&call](const at::Tensor& t) {
    return std::any_of(call.outputs.begin(), call.outputs.end(), [&t](const at::Tensor& o) { return o.is_same(t); });
  };
  if (!call.prepare && (call.direct.input.defined() || call.direct.output.defined())) {
    c.in_elems = call.direct.input.defined() ? call.direct.input.numel() : 0;
    c.out_elems = call.direct.output.defined() ? call.direct.output.numel() : 0;
    return c;
  }
  for (const at::Tensor& t : call.tensors)
    if (t.defined() && !is_output(t)) c.in_elems += t.numel();
  for (const at::Tensor& t : call.outputs)
    if (t.defined()) c.out_elems += t.numel();
  if (c.in_elems == 0) c.in_elems = c.out_elems;  // in place
  return c;
}

FrHandle ProcessGroupPycoll::record_p2p(bool is_send, const at::Tensor& t, int peer, uint64_t seq) {
  FlightRecorder& rec = FlightRecorder::get();
  if (!rec.enabled()) return {};
  const uint64_t n = ++fr_p2p_;
  const int global_peer = peer < static_cast<int>(global_ranks_.size()) ? static_cast<int>(global_ranks_[peer]) : peer;
  // Started when recorded: a send or receive is under way once posted.
  return rec.record(fr_pg_id_, seq, 0, n, is_send ? "send" : "recv", global_peer, t, t, timeout_,
                    /*inputs_may_hold_outputs=*/false, /*started=*/true);
}

void ProcessGroupPycoll::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  cpu_->set_timeout(timeout);
}

void ProcessGroupPycoll::shutdown() {
  // destroy_process_group() shuts the group down while Python objects (a DDP model, a saved
  // handle) may keep it alive: its Store is not polled from then on, as the rank hosting the
  // Store may already have exited (torch logs each failed poll with a stack trace).
  DumpWatcher::get().unwatch(fr_pg_id_);
  if (closed_.exchange(true)) return;
  ReleaseGilIfHeld nogil;
  executor_->stop();  // runs what is queued, then joins
}

std::vector<int64_t> ProcessGroupPycoll::cuda_trace() { return cuda_ ? cuda_->trace() : std::vector<int64_t>(); }

void ProcessGroupPycoll::abort() {
  DumpWatcher::get().unwatch(fr_pg_id_);
  closed_.store(true);
  if (cuda_) cuda_->abort();  // first: a kernel waiting on a peer ends, and the stream drains
  cpu_->abort();
  if (hosts_) {
    // The inter-host sub-groups (NCCL's abort ends its kernels too).
    for (auto* b : {&hosts_->rail, &hosts_->flat, &hosts_->device_rail, &hosts_->device_flat})
      if (*b) (*b)->abort();
  }
  ReleaseGilIfHeld nogil;
  executor_->stop();
}

void ProcessGroupPycoll::check_usable(const char* op) {
  TORCH_CHECK(!closed_.load(), op, ": the process group was shut down or destroyed");
  check_not_broken(op);
}

void ProcessGroupPycoll::check_not_broken(const char* op) {
  if (!is_broken_.load(std::memory_order_acquire)) return;  // every op asks: no lock until it is
  std::lock_guard<std::mutex> g(broken_mu_);
  TORCH_CHECK(broken_.empty(), op, ": the group is unusable after an earlier error: ", broken_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::nothing_to_do(c10d::OpType type, const char* op) {
  check_usable(op);
  auto work = c10::make_intrusive<PycollWork>(rank_, type, op, ++issued_, std::vector<at::Tensor>{},
                                              std::vector<c10::Device>{});
  work->mark_done(nullptr);
  work->settle_future();
  return work;
}

void ProcessGroupPycoll::check_bound_device(const at::Tensor& t) const {
  // init_process_group(device_id=...) binds the group before its first op.
  const auto bound = getBoundDeviceId();
  TORCH_CHECK_VALUE(!bound || !bound->is_cuda() || *bound == t.device(), "pycoll: wrong device: this rank's group is ",
                    "bound to ", bound ? bound->str() : std::string(), " (device_id), got a tensor on ",
                    t.device().str());
}

bool ProcessGroupPycoll::on_cuda_engine(const at::Tensor& t) {
  if (!t.is_cuda() || !cuda_) return false;
  check_bound_device(t);
  return cuda_->point_to_point_on_device(t.device());
}

Engine& ProcessGroupPycoll::engine_for(const OpCall& call) {
  if (call.device.is_cpu()) return hierarchical_ ? *hierarchical_ : *cpu_tensors_;
  check_bound_device(call.tensors.front());
  if (cuda_) {
    Engine* e = cuda_->engine(call.device);
    if (e != nullptr && hosts_) e = &device_hierarchical(*e);
    if (e != nullptr && e->serves(call.op, call.dtype, call.device) &&
        e->takes(call.op, call.algo, weighed_bytes(call)))
      return *e;
  }
  return *staged_;
}

Engine& ProcessGroupPycoll::device_hierarchical(Engine& local) {
  std::lock_guard<std::mutex> g(device_hierarchical_mu_);
  if (!device_hierarchical_) {
    device_hierarchical_ = std::make_unique<HierarchicalEngine>(local, *hosts_, rank_, size_, /*on_device=*/true);
  }
  return *device_hierarchical_;
}

void ProcessGroupPycoll::execute(OpCall& call, Engine& engine, const c10::Stream& stream) {
  // The device queue already runs an engine that enqueues on the op's stream; a staged op runs
  // on the executor thread, whose current stream is not the caller's.
  std::optional<c10::StreamGuard> on_stream;
  if (!engine.enqueues_on_device() && stream.device_type() != at::kCPU) on_stream.emplace(stream);
  // Results go into the user's tensors as a kernel writes them: outside autograd (a tensor may
  // require grad), on any thread.
  const at::NoGradGuard no_grad;
  // Every part runs with the algorithm read at issue; PREMUL_SUM becomes a pre-scale + SUM (as NCCL).
  FlightRecorder& recorder = FlightRecorder::get();
  // An op on a CUDA stream is started when its kernels are (the device queue's watcher).
  if (!engine.enqueues_on_device()) recorder.started(call.fr);
  const IssuingOp issuing(call.fr.record_id);  // what a traced kernel's timeline names as its op
  // Reused by every op of this thread: its capacity stays, so the copy of a plan allocates nothing.
  thread_local std::string plan_text;
  plan_text.clear();
  std::string* const plan_out = debug_info_enabled() || call.fr.recorded() ? &plan_text : nullptr;
  const auto ready_part = [&call, plan_out](Collective& c) {
    c.algo = call.algo;
    c.schedule = call.schedule;
    c.plan_text = plan_out;
    if (c.reduce != ReduceKind::PremulSum) return;
    c.input = c.input * call.premul_factor.to(c.input.device());
    c.reduce = ReduceKind::Sum;
  };
  OpTimer timer;
  Algo algo = Algo::Direct;
  if (!call.prepare) {
    Collective& c = call.direct;
    const at::Tensor user_output = c.output;
    const bool in_place = c.input.defined() && c.input.is_same(c.output);
    if (c.input.defined()) c.input = dense(c.input);
    if (c.output.defined()) c.output = in_place ? c.input : dense(c.output);
    ready_part(c);
    algo = engine.run(c, stream);
    if (call.write_back) write_back(user_output, c.output);
  } else {
    std::vector<Collective> parts = call.prepare();
    for (Collective& c : parts) {
      ready_part(c);
      algo = engine.run(c, stream);
    }
    if (call.finish) call.finish(parts);
  }
  recorder.ran(call.fr, engine.name(), algo_name(algo), plan_text);
  record_op(call.stats_name, call.logged_bytes, algo, timer, rank_, size_, plan_text);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::run(OpCall call) {
  check_usable(call.name);
  Engine& engine = engine_for(call);
  const uint64_t seq = ++issued_;
  call.fr = record_collective(call, seq);
  const ParamCommsRecord comms([&] { return param_comms_call(call, seq); });  // while the profiler records
  if (engine.enqueues_on_device()) {
    after_staged_ops(call.name);
    // launch() runs the body before it returns: pass it a pointer (a one-pointer lambda fits
    // std::function's inline storage, so the hot path allocates nothing for it).
    struct Job {
      ProcessGroupPycoll* pg;
      OpCall* call;
      Engine* engine;
    } job{this, &call, &engine};
    const Job* j = &job;
    const FrHandle fr = call.fr;
    auto work = cuda_->launch(
        call.type, call.name, seq, call.tensors, call.outputs, call.async,
        [j](const c10::Stream& s) { j->pg->execute(*j->call, *j->engine, s); }, DeviceQueue::Lane::Collective, fr);
    if (auto* w = dynamic_cast<PycollWork*>(work.get())) w->track(fr);
    return in_block(std::move(work));
  }
  // Host-side engines run on the executor; a staged op's copies follow the caller's stream as it was now.
  const c10::Stream stream = current_stream(call.device);
  const auto type = call.type;
  const char* name = call.name;
  const bool async = call.async;
  auto outputs = call.outputs;
  const FrHandle fr = call.fr;
  const bool staged = call.device.is_cuda();
  // The group's CUDA ops take effect in issue order, as on NCCL's one stream, both ways: a staged
  // op reads its inputs after the device collectives issued before it (after_collectives), and a
  // device op waits for the staged ones before it (after_staged_ops).
  std::function<void()> after_device = staged && cuda_ ? cuda_->after_collectives(call.device) : nullptr;
  auto work = launch_on_executor(
      type, name, seq, std::move(outputs), async,
      [this, call = std::move(call), &engine, stream, after_device = std::move(after_device)]() mutable {
        if (after_device) after_device();
        execute(call, engine, stream);
      },
      fr);
  if (staged) {
    std::lock_guard<std::mutex> g(pending_staged_mu_);
    pending_staged_ = c10::weak_intrusive_ptr<c10d::Work>(work);
    has_pending_staged_.store(true, std::memory_order_release);
  }
  if (staged && async && !staged_cuda_async_) {
    // Its Future is complete when handed out, as an NCCL op's is from issue (a staged op's cannot be
    // before it ran): callbacks then run at once, on the asking thread, in issue order on every rank.
    // Completed later on a completion thread, a callback that issues a collective (torch's PowerSGD
    // hook) would issue it at a time that differs between ranks. Decision 0041.
    if (auto* w = dynamic_cast<PycollWork*>(work.get())) w->ran_before_future = true;
  }
  return in_block(std::move(work));
}

// Before an op of the device engine: a staged op finishes on the executor, so the device op waits
// on the host for the last one issued before it (ranks sharing one GPU switch between the two by
// size). Held weakly: a Work the caller dropped and the executor finished is no longer needed.
void ProcessGroupPycoll::after_staged_ops(const char* op) {
  if (!has_pending_staged_.load(std::memory_order_acquire)) return;
  c10::intrusive_ptr<c10d::Work> w;
  {
    std::lock_guard<std::mutex> g(pending_staged_mu_);
    w = pending_staged_.lock();
    pending_staged_.reset();
    has_pending_staged_.store(false, std::memory_order_release);
  }
  if (!w || w->isCompleted()) return;
  try {
    w->wait();  // the host until it ran; the caller's stream after its copies
  } catch (const std::exception&) {
    // Its own Work reports its error; whether the group goes on is checked next.
  }
  check_usable(op);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupPycoll::launch_on_executor(c10d::OpType type, const char* op, uint64_t seq,
                                                                      std::vector<at::Tensor> outputs, bool async_op,
                                                                      std::function<void()> body, const FrHandle& fr) {
  std::vector<c10::Device> devices;
  for (const auto& t : outputs) {
    if (t.defined() && t.is_cuda() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  auto work = c10::make_intrusive<PycollWork>(rank_, type, op, seq, outputs, devices);
  work->track(fr);
  // The waiter polls only while the op runs on the engine thread alone: a pipelined op's lanes
  // take the rank's other CPUs, and a poller among them would stall one.
  if (poll_before_sleep_.count() > 0) {
    size_t bytes = 0;
    for (const auto& t : outputs) bytes += t.defined() ? t.nbytes() : 0;
    if (cpu_->runs_on_one_thread(bytes)) work->poll_before_sleep = poll_before_sleep_;
  }
  auto task = [this, work, op, body = std::move(body)]() {
    std::exception_ptr err;
    try {
      check_not_broken(op);
      body();
    } catch (const GroupBroken& e) {
      {
        std::lock_guard<std::mutex> g(broken_mu_);
        if (broken_.empty()) broken_ = e.what();
        is_broken_.store(true, std::memory_order_release);
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
    if (SerialExecutor::running_inline()) {
      work->mark_done(err);
      work->settle_future();  // no callback can be attached yet: complete it here, no thread hand-off
    } else {
      work->mark_done_and_settle(err);
    }
  };
  executor_->submit(std::move(task), !async_op);
  return work;
}

}  // namespace pycoll

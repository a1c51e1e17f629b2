// ProcessGroupPycoll: the c10d::Backend that torch.distributed drives.
//
// Contract (as for every c10d backend): every rank of the group issues the
// same collectives in the same order; point-to-point calls match by
// (peer, tag) in issue order.
//
// Every collective takes one path: argument checks with "pycoll::<op>:"
// messages (<op> is the c10d entry's name, the word the stats and the debug
// log use), then an OpCall (op_call.h), then run(): one sequence number, the
// engine that serves the call (engines/engine.h: the CUDA engine, the staged
// engine for CUDA tensors it cannot take, the CPU engine), one Work. The
// entry points live by concern: collectives.cpp, coalesced.cpp,
// point_to_point.cpp; this file's .cpp holds the runner and the lifecycle.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cpu/cpu_engine.h"
#include "backend/coalesced_work.h"
#include "backend/device_queue.h"
#include "backend/executor.h"
#include "backend/flight_recorder.h"
#include "backend/op_call.h"
#include "backend/param_comms_record.h"
#include "backend/self_p2p.h"
#include "backend/work.h"
#include "engines/host_layout.h"

namespace pycoll {

class ProcessGroupPycoll : public c10d::Backend {
 public:
  // `hosts` is set when the group spans hosts (pycollectives/hosts.py decides): the CPU engine
  // then serves this rank's host and the hierarchical engine the group.
  ProcessGroupPycoll(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout, std::string group_name,
                     std::optional<HostLayout> hosts = std::nullopt);
  ~ProcessGroupPycoll() override;

  const std::string getBackendName() const override { return "pycoll"; }
  // batch_isend_irecv: torch brackets the ops with startCoalescing/endCoalescing, and the sends
  // and receives of CUDA tensors run in one launch (backend/coalescing.cpp). PYCOLL_COALESCE_P2P=0
  // turns it off (torch then issues them one by one).
  bool supportsCoalescing() const override { return coalesce_p2p_; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // split_group (what DeviceMesh uses after init_process_group(device_id=)): backend/split.cpp.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  // init_process_group(device_id=cuda:k): makes the group's CUDA engine now, while every rank is in
  // init, instead of at its first CUDA op (which every rank must then issue before any completes).
  void eagerConnectSingleDevice(at::Device device) override;
  uint64_t getSequenceNumberForGroup() override { return issued_.load(); }
  // Every rank's count starts at 0 when the group is made, so there is nothing to agree on here
  // (torch 2.11's default throws, which breaks TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper group).
  void setSequenceNumberForGroup() override {}
  void setTimeout(std::chrono::milliseconds timeout) override;
  void shutdown() override;
  void abort() override;
  // The CUDA engine's last traced kernel timeline (PYCOLL_CUDA_TRACE=1, cuda/kernels/trace.cuh); empty
  // in a CPU-only build or before the group's first CUDA collective.
  std::vector<int64_t> cuda_trace();

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  // torch sends sparse CUDA tensors here (sparse CPU ones to allreduce); both take the same path.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  // Gloo's debugging barrier, on the Store: rank 0 names the ranks that did not arrive in time.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override;

  // Not a c10d virtual on every supported torch: gather into one flat tensor.
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts = c10d::GatherOptions());

  CpuEngine& cpu() { return *cpu_; }

 private:
  // The one runner: sequence number, engine, Work (see the top of this file).
  c10::intrusive_ptr<c10d::Work> run(OpCall call);
  // prepare → pre-scale → the engine runs each part → finish → stats (on the op's thread/stream).
  void execute(OpCall& call, Engine& engine, const c10::Stream& stream);
  // The engine that runs `call`: the first of CUDA engine, staged, CPU that serves it.
  Engine& engine_for(const OpCall& call);
  // Creates the Work, wraps body with error handling, and hands it to the
  // executor (inline if the caller blocks anyway).
  c10::intrusive_ptr<c10d::Work> launch_on_executor(c10d::OpType type, const char* op, uint64_t seq,
                                                    std::vector<at::Tensor> outputs, bool async_op,
                                                    std::function<void()> body, const FrHandle& fr = {});
  // The flight recorder's entry of a collective (issue order) or a send/recv (`peer`: group rank).
  FrHandle record_collective(const OpCall& call, uint64_t seq);
  // What torch.profiler's record_param_comms event of a call carries (param_comms_record.h): the
  // group's part, and a collective's.
  ParamCommsCall param_comms_group(const char* op, at::ScalarType dtype, int64_t seq) const;
  ParamCommsCall param_comms_call(const OpCall& call, uint64_t seq) const;
  FrHandle record_p2p(bool is_send, const at::Tensor& t, int peer, uint64_t seq);
  void check_usable(const char* op);
  void check_not_broken(const char* op);  // raises once an op broke the group (GroupBroken)
  // A finished Work for a call with nothing to move (an empty coalesced list on every rank).
  c10::intrusive_ptr<c10d::Work> nothing_to_do(c10d::OpType type, const char* op);
  // For CUDA tensors: the device the group is bound to (init_process_group(device_id=)) must be t's.
  void check_bound_device(const at::Tensor& t) const;
  // A CUDA tensor that the CUDA engine serves (the device queue runs its point-to-point).
  bool on_cuda_engine(const at::Tensor& t);
  // A group across hosts: the hierarchical engine of CUDA tensors over `local` (the CUDA engine
  // of this host's ranks) and NCCL, made at the first CUDA collective.
  Engine& device_hierarchical(Engine& local);
  // all_reduce of a sparse COO tensor (SUM), from uneven all_gathers (backend/sparse_all_reduce.cpp).
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(const at::Tensor& t, const c10d::AllreduceOptions& opts);
  // Inside a coalescing block: adds w to the block's Work. Returns w.
  c10::intrusive_ptr<c10d::Work> in_block(c10::intrusive_ptr<c10d::Work> w);
  void after_staged_ops(const char* op);  // before an op of the device engine: the staged ops issued earlier
  // Inside a coalescing block: holds a send/recv of the CUDA engine until the block ends and
  // returns the block's Work; outside, nullptr.
  c10::intrusive_ptr<c10d::Work> defer_device_p2p(bool is_send, const at::Tensor& t, int peer);
  // send and recv: checks, then to self, the device queue, or the host channels.
  c10::intrusive_ptr<c10d::Work> point_to_point(bool is_send, std::vector<at::Tensor>& tensors, int peer, int tag);
  // Point-to-point on the CUDA engine (`peer` numbered as the engine numbers ranks).
  c10::intrusive_ptr<c10d::Work> device_p2p(bool is_send, const at::Tensor& t, int peer, const FrHandle& fr);
  // Point-to-point on the CPU engine's channels (CPU tensors, and CUDA tensors through host memory).
  c10::intrusive_ptr<c10d::Work> host_p2p(bool is_send, const char* op, const at::Tensor& t, int peer, int tag);
  // Point-to-point with a rank on another host, on the inter-host engine.
  c10::intrusive_ptr<c10d::Work> inter_host_p2p(bool is_send, const at::Tensor& t, int peer, int tag);

  c10::intrusive_ptr<c10d::Store> store_;
  std::string group_name_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<CpuEngine> cpu_;
  std::unique_ptr<Engine> cpu_tensors_;   // CPU tensors, on cpu_ (this host's ranks)
  std::unique_ptr<Engine> hierarchical_;  // a group across hosts: CPU tensors, on cpu_tensors_ + Gloo
  // split(): ProcessGroup::splitGroup calls it once per device type (cpu, cuda) with the same
  // group name, and both must get the one child (it owns Store keys and shared memory). Keyed by
  // torch's name for the child; `index` counts the splits of this group (backend/split.cpp).
  struct SplitChild {
    uint64_t index;
    std::optional<c10::weak_intrusive_ptr<c10d::Backend>> backend;  // none outside the child
  };
  std::mutex split_mu_;
  uint64_t splits_ = 0;
  std::map<std::string, SplitChild> split_children_;
  std::optional<HostLayout> hosts_;
  std::unique_ptr<Engine> staged_;     // CUDA tensors through host memory, on the CPU tensors' engine
  std::unique_ptr<DeviceQueue> cuda_;  // nullptr in a build without CUDA (or across hosts without NCCL)
  std::mutex device_hierarchical_mu_;
  std::unique_ptr<Engine> device_hierarchical_;  // across hosts: CUDA tensors on cuda_'s engine + NCCL
  std::unique_ptr<SerialExecutor> executor_;
  // How long a waiter polls before it sleeps: nonzero only where every rank on the host has a CPU
  // to spare for it (common/brief_spin.h).
  std::chrono::microseconds poll_before_sleep_{0};
  bool staged_cuda_async_ = false;  // PYCOLL_STAGED_CUDA_ASYNC, read when the group is made
  std::atomic<uint64_t> issued_{0};
  // The flight recorder's view of this group: its id there, and its collective and p2p counts
  // (torch numbers the two apart).
  int fr_pg_id_ = -1;
  std::atomic<uint64_t> fr_collectives_{0}, fr_p2p_{0};
  std::vector<int64_t> global_ranks_;  // group rank -> global rank, once Python said (else empty)

 public:
  // torch's creator knows the group's global ranks: the recorder's dumps name them.
  void describe_for_recorder(const std::string& desc, const std::vector<int64_t>& global_ranks);

 private:
  uint64_t monitored_barriers_ = 0;  // called in the same order on every rank (backend/monitored_barrier.cpp)
  SelfP2P self_p2p_{rank_};
  std::mutex broken_mu_;
  std::string broken_;                  // set once the group can no longer run collectives
  std::atomic<bool> is_broken_{false};  // broken_ is set
  std::atomic<bool> closed_{false};
  // The open coalescing block (the caller's thread opens and closes it; other threads may issue).
  struct CoalescingBlock {
    c10::intrusive_ptr<CoalescedWork> work;
    std::vector<DeviceQueue::P2PRequest> device_p2p;  // CUDA-engine sends/receives, in posting order
  };
  static bool coalesce_p2p_from_settings();  // PYCOLL_COALESCE_P2P
  bool coalesce_p2p_ = coalesce_p2p_from_settings();
  std::mutex coalescing_mu_;
  std::optional<CoalescingBlock> coalescing_;
  std::atomic<bool> coalescing_open_{false};  // coalescing_ holds a block
  // The last staged op of CUDA tensors, until an op of the device engine waited for it.
  std::mutex pending_staged_mu_;
  c10::weak_intrusive_ptr<c10d::Work> pending_staged_{c10::intrusive_ptr<c10d::Work>()};
  std::atomic<bool> has_pending_staged_{false};
};

}  // namespace pycoll

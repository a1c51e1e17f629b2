// ProcessGroupPycoll: the c10d::Backend that torch.distributed drives.
//
// Contract (as for every c10d backend): every rank of the group issues the
// same collectives in the same order; point-to-point calls match by
// (peer, tag) in issue order. Each entry point has the same shape: argument
// checks with "pycoll::<op>:" messages, then a Work, then the task goes to
// the group's serial executor (collectives) or the p2p threads (send/recv).
// One backend object serves CPU and CUDA tensors: CPU tensors run on the CPU
// engine; CUDA tensors run on the CUDA engine when it is built and the peers
// are reachable, otherwise they are staged through host memory.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/cpu_engine.h"
#include "backend/executor.h"
#include "backend/self_p2p.h"
#include "backend/work.h"

namespace pycoll {

class CudaOps;  // defined in backend/cuda_ops.h when built with CUDA

class ProcessGroupPycoll : public c10d::Backend {
 public:
  ProcessGroupPycoll(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout, std::string group_name);
  ~ProcessGroupPycoll() override;

  const std::string getBackendName() const override { return "pycoll"; }
  bool supportsCoalescing() const override { return false; }
  bool supportsSplitting() const override { return false; }
  uint64_t getSequenceNumberForGroup() override { return issued_.load(); }
  // Every rank's count starts at 0 when the group is made, so there is nothing to agree on here
  // (torch 2.11's default throws, which breaks TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper group).
  void setSequenceNumberForGroup() override {}
  void setTimeout(std::chrono::milliseconds timeout) override;
  void shutdown() override;
  void abort() override;
  // The CUDA engine's last traced kernel timeline (PYCOLL_CUDA_TRACE=1, kernels/trace.cuh); empty
  // in a CPU-only build or before the group's first CUDA collective.
  std::vector<int64_t> cuda_trace();

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
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
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override;

  // Not a c10d virtual on every supported torch: gather into one flat tensor.
  c10::intrusive_ptr<c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                    const c10d::GatherOptions& opts = c10d::GatherOptions());

  CpuEngine& cpu() { return *cpu_; }

 private:
  using Body = std::function<void()>;
  // Creates the Work, wraps body with error handling, logging and stats,
  // and hands it to the executor (inline if the caller blocks anyway).
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* op, std::vector<at::Tensor> outputs,
                                        bool async_op, Body body);
  void check_usable(const char* op);
  // Runs a CUDA op through host memory: copies in, runs the CPU path to the
  // end, copies results back. The fallback for ops or groups the CUDA engine
  // does not serve (and for builds without it).
  using StagedCall = std::function<c10::intrusive_ptr<c10d::Work>(std::vector<at::Tensor>& host)>;
  c10::intrusive_ptr<c10d::Work> staged(c10d::OpType type, const char* op, std::vector<at::Tensor> device_tensors,
                                        const StagedCall& call);
  // True when t is a CUDA tensor that the CUDA engine serves.
  bool on_engine(const at::Tensor& t);

  c10::intrusive_ptr<c10d::Store> store_;
  std::string group_name_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<CpuEngine> cpu_;
  std::unique_ptr<SerialExecutor> executor_;
#ifdef PYCOLL_WITH_CUDA
  std::unique_ptr<CudaOps> cuda_;
#endif
  std::atomic<uint64_t> issued_{0};
  SelfP2P self_p2p_{rank_};
  std::mutex broken_mu_;
  std::string broken_;  // set once the group can no longer run collectives
  std::atomic<bool> closed_{false};
};

}  // namespace pycoll

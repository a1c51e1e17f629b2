// Collectives across hosts: the engine of each host (shared memory for CPU tensors, CUDA IPC for
// CUDA tensors) for the ranks inside it, and an inter-host engine (a torch backend: Gloo for CPU
// tensors, NCCL for CUDA tensors) between hosts. We write no network transport.
//
// On CUDA tensors every step is enqueued on the op's stream: our kernels directly, NCCL's after
// its stream waits for ours, and its Work's wait() makes ours wait for NCCL (it blocks no host
// thread). Every rank issues the same steps in the same order, so the two libraries' kernels
// meet in the same order everywhere.
//
// Terms
//   L       ranks per host (local size); N hosts; rank = the group rank.
//   rail    the N ranks with the same local rank, one per host (HostLayout::rail).
//   shard   1/L of a message, padded so that L shards cover it.
//
// all_reduce of n elements (uniform layout, L > 1, N > 1):
//   1. reduce-scatter inside the host: local rank l holds the host's sum of shard l;
//   2. all-reduce of shard l on rail l across hosts (n/L elements cross hosts per rank);
//   3. all-gather inside the host.
//   AVG runs as SUM on both levels and divides once at the end. Every rank ends with the same
//   bits: each shard is reduced once, by one rail, and copied to the others.
// reduce_scatter of n blocks of m elements (same layout):
//   1. the input's blocks reordered so that the N blocks of rail l sit side by side;
//   2. reduce-scatter inside the host: local rank l holds the host's sum of rail l's blocks;
//   3. reduce-scatter of those N blocks along rail l: this rank's block, (N-1) m elements
//      crossing hosts per rank (half of what the all_reduce form would send).
//   Bitwise ops on NCCL (which has none) run the all_reduce above and keep this rank's block.
// all_gather (same layout): along the rail (the N blocks of this rank's local rank), then inside
//   the host, then into rank order.
// Which form `auto` runs: engines/host_form_model.h (the table pycoll-bench --hosts --calibrate
// measured for this layout, else the built-in rule: flat below 128 KiB for CUDA all_reduce, below
// 32 KiB for CUDA reduce_scatter and below 512 KiB for CUDA all_gather, where NCCL's one call
// wins). The other ops, and every op of a group whose hosts have different rank counts, run flat
// on the inter-host engine.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engines/call_check.h"
#include "engines/engine.h"
#include "engines/host_layout.h"

namespace pycoll {

class HierarchicalEngine : public Engine {
 public:
  // `local` runs the ops among host_ranks (its ranks are the local ranks). `on_device`: the CUDA
  // engine of a host with the layout's device_rail/device_flat (NCCL) between hosts; else the CPU
  // engine with rail/flat (Gloo).
  HierarchicalEngine(Engine& local, const HostLayout& layout, int rank, int size, bool on_device);
  const char* name() const override { return "hierarchical"; }
  bool serves(OpCode op, at::ScalarType dtype, const at::Device& device) override;
  bool enqueues_on_device() const override { return on_device_; }
  Algo run(const Collective& c, const c10::Stream& stream) override;

  const HostLayout& layout() const { return layout_; }

 private:
  // all_reduce of `in` into `out` (same shape, contiguous): hierarchical when the layout allows.
  // `call`: the op as the user called it (its signature is compared across hosts).
  void all_reduce(const Collective& call, const at::Tensor& in, const at::Tensor& out, ReduceKind op,
                  const c10::Stream& stream, bool* hierarchical);
  // The layout allows the hierarchical forms: the same number of ranks on every host, more than
  // one host, more than one rank per host.
  bool can_be_hierarchical() const;
  // Host h holds group ranks h * L .. h * L + L - 1 (torchrun's layout; uniform layouts only).
  bool hosts_hold_consecutive_ranks() const;
  // Whether `c` runs `op`'s hierarchical form at `bytes` (as pycoll-bench counts them): as
  // PYCOLL_ALGO forces, else as host_form_model.h chooses (calibrated, else built in).
  bool hierarchical_form(const Collective& c, OpCode op, size_t bytes) const;
  // One op of the host's engine (reduce: only for the reductions).
  void run_local(OpCode op, const at::Tensor& in, const at::Tensor& out, ReduceKind reduce, const c10::Stream& stream,
                 int root = 0);
  // Small all_reduce of CPU tensors: reduce to the host's first rank, all-reduce among the hosts'
  // first ranks, broadcast inside the host (one inter-host call per host, not one per rail).
  bool leader_form(size_t bytes) const;
  // How many pieces a hierarchical all_reduce, reduce_scatter or all_gather of `bytes` (its
  // largest buffer) runs in, cut into at most `units` pieces: 1 for CUDA tensors, below 4 times the
  // piece size, and on links faster than 1 Gbit/s or of a rate not known (PYCOLL_HOST_PIECE_BYTES).
  int64_t pieces_of(size_t bytes, int64_t units) const;
  Algo reduce_scatter(const Collective& c, const c10::Stream& stream);
  // The CPU hierarchical form where pieces_of() > 1; `check` is finished after the first piece's
  // host phase.
  Algo reduce_scatter_in_pieces(const Collective& c, const c10::Stream& stream, std::optional<CallCheck>& check);
  Algo all_gather(const Collective& c, const c10::Stream& stream);
  // The group ranks in the order step 1 of reduce_scatter puts their blocks (on `device`).
  const at::Tensor& block_order(const at::Device& device);
  const std::vector<int64_t>& rail_major_ranks();  // the same list, on the host
  // CPU tensors of one row per rank: row i of `to` gets row order[i] of `from` (gather), or row
  // order[i] of `to` gets row i of `from` (scatter), order = rail_major_ranks(). One copy per row:
  // index_select/index_copy_ move a row element by element, about 10x slower (decision 0029).
  void gather_rows(const at::Tensor& from, const at::Tensor& to);
  void scatter_rows(const at::Tensor& from, const at::Tensor& to);
  // Starts comparing c with every rank's call (flat group); nullopt where not checked.
  std::optional<CallCheck> start_check(const Collective& c);
  Algo run_flat(const Collective& c);
  // `numel` elements of `options`' dtype: on CPU a view of a buffer kept across calls, up to
  // 128 MiB (ops run one at a time; a fresh buffer of several MiB costs its page faults on every
  // call, inside the local phase its peers wait on); on a device a fresh tensor (the caching
  // allocator is cheap and keeps stream order).
  at::Tensor scratch(int64_t numel, const at::TensorOptions& options);

  Engine& local_;
  HostLayout layout_;
  c10::intrusive_ptr<c10d::Backend> rail_;  // this rank's rail: layout_.rail or device_rail
  c10::intrusive_ptr<c10d::Backend> flat_;  // every rank: layout_.flat or device_flat
  int rank_;
  int size_;
  bool on_device_;
  bool check_calls_;  // PYCOLL_CHECK_ACROSS_HOSTS
  int64_t piece_bytes_;  // PYCOLL_HOST_PIECE_BYTES as the link makes it (0: one piece), read once
  at::Tensor block_order_;
  std::vector<int64_t> rail_major_ranks_;
  at::Tensor scratch_;  // CPU: bytes, grown as needed (scratch())
};

}  // namespace pycoll

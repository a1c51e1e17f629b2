// Collectives across hosts: the engine of each host (shared memory) for the ranks inside it, and
// an inter-host engine (a torch backend: Gloo for CPU tensors) between hosts. We write no network
// transport.
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
// reduce_scatter runs the all_reduce above and keeps this rank's block. The other ops, and every
// op of a group whose hosts have different rank counts, run flat on the inter-host engine.
#pragma once

#include "engines/engine.h"
#include "engines/host_layout.h"

namespace pycoll {

class HierarchicalEngine : public Engine {
 public:
  // `local` runs the ops among host_ranks (its ranks are the local ranks).
  HierarchicalEngine(Engine& local, HostLayout layout, int rank, int size)
      : local_(local), layout_(std::move(layout)), rank_(rank), size_(size) {}
  const char* name() const override { return "hierarchical"; }
  bool serves(OpCode op, at::ScalarType dtype, const at::Device& device) override;
  bool enqueues_on_device() const override { return false; }
  Algo run(const Collective& c, const c10::Stream& stream) override;

  const HostLayout& layout() const { return layout_; }

 private:
  // all_reduce of `in` into `out` (same shape, contiguous): hierarchical when the layout allows.
  void all_reduce(const at::Tensor& in, const at::Tensor& out, ReduceKind op, bool* hierarchical);
  void flat_all_reduce(const at::Tensor& t, ReduceKind op);
  void rail_all_reduce(const at::Tensor& t, ReduceKind op);

  Engine& local_;
  HostLayout layout_;
  int rank_;
  int size_;
};

}  // namespace pycoll

// Where a group's ranks live: which host each is on, and the inter-host sub-groups the backend
// was given for them (pycollectives/hosts.py makes them: Gloo between hosts for CPU tensors,
// NCCL for CUDA tensors where CUDA is available).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <string>
#include <vector>

namespace pycoll {

struct HostLayout {
  std::string host_id;  // this rank's host identity (PYCOLL_HOSTID, else hostname + boot id)
  int host_index = 0;   // hosts are numbered in the order of their lowest group rank
  int num_hosts = 1;
  std::vector<int> host_ranks;  // the group ranks on this rank's host, ascending
  std::vector<int> host_of;     // host index of every group rank
  // Every host has the same number of ranks (the torchrun layout): the hierarchical algorithms
  // apply. Otherwise every op runs flat on the inter-host engine.
  bool uniform = false;
  // The ranks with this rank's local rank on every host, ordered by host ("rail"); null when the
  // layout is not uniform. Its rank is host_index.
  c10::intrusive_ptr<c10d::Backend> rail;
  // Every rank of the group, in group-rank order: the flat fallback.
  c10::intrusive_ptr<c10d::Backend> flat;
  // The same two for CUDA tensors (NCCL); null where this process has no CUDA, and then CUDA
  // tensors go through host memory and the two above.
  c10::intrusive_ptr<c10d::Backend> device_rail;
  c10::intrusive_ptr<c10d::Backend> device_flat;
  // The rate of the links between hosts in bits per second (PYCOLL_LINK), 0 where not known.
  int64_t link_bps = 0;

  int local_rank(int group_rank) const {
    for (size_t i = 0; i < host_ranks.size(); ++i)
      if (host_ranks[i] == group_rank) return static_cast<int>(i);
    return -1;  // on another host
  }
  int local_size() const { return static_cast<int>(host_ranks.size()); }
};

}  // namespace pycoll

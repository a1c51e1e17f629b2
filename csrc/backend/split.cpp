// split_group and eager connection: what DeviceMesh and init_process_group(device_id=) use.
//
// A split child is made exactly as torch makes any pycoll group (pycollectives/hosts.py:
// make_backend, through Python), over this group's Store under a prefix of the child's own: so it
// classifies its hosts and builds its engines like a new_group would. Only the members
// take part; a rank outside `ranks` gets nullptr (torch then returns GroupMember.NON_GROUP_MEMBER).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdio>

#include "backend/gil_release.h"
#include "backend/process_group.h"
#include "common/check.h"

namespace pycoll {

namespace py = pybind11;

namespace {

// FNV-1a over the ranks, in hex: the same on every process (std::hash need not be), and short
// enough for shared-memory names however many ranks the child has.
std::string ranks_digest(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks) {
    for (int b = 0; b < 4; ++b) {
      h ^= (static_cast<uint32_t>(r) >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(h));
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupPycoll::getBackendOptions() {
  // A fresh object each time: splitGroup writes the child's name and timeout into what it gets.
  auto opts = c10::make_intrusive<c10d::Backend::Options>("pycoll", timeout_);
  opts->group_name = group_name_;
  return opts;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupPycoll::split(const c10::intrusive_ptr<c10d::Store>& /*store*/,
                                                            const std::vector<int>& ranks,
                                                            const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  // `ranks`: ranks of this group, ascending (splitGroup sorts them).
  for (int r : ranks) {
    TORCH_CHECK_VALUE(r >= 0 && r < size_, "pycoll::split: rank ", r, " is not in this group of ", size_, " ranks");
  }
  // The child is named, and meets its members on the Store, by how many splits this group has
  // seen, not by torch's name or the Store torch prefixed with it: torch 2.11 salts that name with
  // the number of groups the rank has registered, which differs between ranks after a new_group
  // that left some of them out, and the members then wait for each other under different keys
  // forever. Every rank of this group calls split for every split_group (those outside get
  // nullptr), once per device type with one name, so the count agrees on every rank.
  const std::string torch_name = opts && !opts->group_name.empty() ? opts->group_name : group_name_ + ":split";
  const std::chrono::milliseconds timeout = opts ? opts->timeout : timeout_;
  std::lock_guard<std::mutex> g(split_mu_);
  auto [it, fresh] = split_children_.try_emplace(torch_name, SplitChild{splits_, std::nullopt});
  if (fresh) ++splits_;
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  if (it->second.backend) {
    if (auto child = it->second.backend->lock()) return child;
  }
  // Siblings of one split (e.g. halves) share the count: the members' ranks tell them apart.
  const std::string name = group_name_ + ":split" + std::to_string(it->second.index) + ":" + ranks_digest(ranks);
  auto child_store = c10::make_intrusive<c10d::PrefixStore>("pycoll/" + name + "/", store_);
  c10::intrusive_ptr<c10d::Backend> child;
  {
    py::gil_scoped_acquire gil;
    py::object native = py::module::import("pycollectives._C").attr("ProcessGroupPycoll");
    py::object made =
        py::module::import("pycollectives.hosts")
            .attr("make_backend")(native, c10::intrusive_ptr<c10d::Store>(child_store),
                                  static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), timeout, name);
    child = made.cast<c10::intrusive_ptr<c10d::Backend>>();
  }
  it->second.backend.emplace(child);
  return child;
}

void ProcessGroupPycoll::eagerConnectSingleDevice(at::Device device) {
  if (!device.is_cuda() || !cuda_) return;
  ReleaseGilIfHeld nogil;  // the engine's start waits on the Store for every peer
  (void)cuda_->engine(device);
  // Between hosts, the NCCL communicator this group's layout uses (every rank connects the same
  // ones, in the same order): the rail where hosts are alike, else the flat group.
  if (hosts_) {
    const auto& inter = hosts_->uniform ? hosts_->device_rail : hosts_->device_flat;
    if (inter) inter->eagerConnectSingleDevice(device);
  }
}

}  // namespace pycoll

// split_group and eager connection: what DeviceMesh and init_process_group(device_id=) use.
//
// A split child is made exactly as torch makes any pycoll group (pycollectives/hosts.py:
// make_backend, through Python), over the members' Store that splitGroup prefixed with the child's
// name: so it classifies its hosts and builds its engines like a new_group would. Only the members
// take part; a rank outside `ranks` gets nullptr (torch then returns GroupMember.NON_GROUP_MEMBER).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>

#include "backend/gil_release.h"
#include "backend/process_group.h"
#include "common/check.h"

namespace pycoll {

namespace py = pybind11;

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupPycoll::getBackendOptions() {
  // A fresh object each time: splitGroup writes the child's name and timeout into what it gets.
  auto opts = c10::make_intrusive<c10d::Backend::Options>("pycoll", timeout_);
  opts->group_name = group_name_;
  return opts;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupPycoll::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                            const std::vector<int>& ranks,
                                                            const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  // `ranks`: ranks of this group, ascending (splitGroup sorts them).
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  for (int r : ranks) {
    TORCH_CHECK_VALUE(r >= 0 && r < size_, "pycoll::split: rank ", r, " is not in this group of ", size_, " ranks");
  }
  const std::string name = opts && !opts->group_name.empty() ? opts->group_name : group_name_ + ":split";
  const std::chrono::milliseconds timeout = opts ? opts->timeout : timeout_;
  std::lock_guard<std::mutex> g(split_mu_);
  auto it = split_children_.find(name);
  if (it != split_children_.end()) {
    if (auto child = it->second.lock()) return child;
  }
  c10::intrusive_ptr<c10d::Backend> child;
  {
    py::gil_scoped_acquire gil;
    py::object native = py::module::import("pycollectives._C").attr("ProcessGroupPycoll");
    py::object made = py::module::import("pycollectives.hosts")
                          .attr("make_backend")(native, store, static_cast<int>(me - ranks.begin()),
                                                static_cast<int>(ranks.size()), timeout, name);
    child = made.cast<c10::intrusive_ptr<c10d::Backend>>();
  }
  split_children_.insert_or_assign(name, c10::weak_intrusive_ptr<c10d::Backend>(child));
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

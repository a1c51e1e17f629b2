#include "cuda/all_reduce_registry.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include "cuda/engine_limits.h"
#include "transport/cuda_ipc/check_word.h"

namespace pycoll {
namespace gpu {

namespace {

// Function-local statics: registrations run from other files' static initializers, in an order
// the linker chooses, so the lists must exist before the first of them.
std::vector<AllReduceProtocol>& protocols() {
  static std::vector<AllReduceProtocol> list;
  return list;
}
std::map<std::string, AllReduceLauncher>& launchers() {
  static std::map<std::string, AllReduceLauncher> m;
  return m;
}

}  // namespace

bool register_all_reduce_protocol(const AllReduceProtocol& p) {
  auto& list = protocols();
  const std::string name = p.name;
  if (!p.read_limits || !p.agreement || !p.plan || !p.fits || p.algos == 0)
    throw std::logic_error("all_reduce protocol '" + name + "' is registered without all its parts");
  if (bool(p.region_bytes) != bool(p.region_param) || bool(p.region_bytes) != bool(p.ranges))
    throw std::logic_error("all_reduce protocol '" + name + "' gives only part of its region (size, param, ranges)");
  if (int(list.size()) >= cuda_ipc::kMaxProtocolRegions)
    throw std::logic_error("more all_reduce protocols than cuda_ipc::kMaxProtocolRegions");
  if (p.check_code != 0 &&
      (p.check_code < cuda_ipc::kFirstRegisteredCheckPlan || p.check_code > cuda_ipc::kLastRegisteredCheckPlan ||
       cuda_ipc::check_plan_taken(p.check_code)))
    throw std::logic_error("all_reduce protocol '" + name + "': check code " + std::to_string(p.check_code) +
                           " is taken or outside 9..13");
  for (const auto& q : list)
    if (name == q.name) throw std::logic_error("all_reduce protocol '" + name + "' is registered twice");
  if (p.check_code != 0) cuda_ipc::register_check_plan_name(p.check_code, p.check_name);
  list.push_back(p);
  std::stable_sort(list.begin(), list.end(), [](const AllReduceProtocol& a, const AllReduceProtocol& b) {
    return a.priority != b.priority ? a.priority < b.priority : std::string(a.name) < b.name;
  });
  return true;
}

const std::vector<AllReduceProtocol>& all_reduce_protocols() { return protocols(); }

int find_all_reduce_protocol(const std::string& name) {
  const auto& list = protocols();
  for (size_t i = 0; i < list.size(); ++i)
    if (name == list[i].name) return int(i);
  return -1;
}

std::vector<cuda_ipc::ProtocolRegion> protocol_regions(const EngineLimits& l) {
  std::vector<cuda_ipc::ProtocolRegion> out;
  const auto& list = protocols();
  for (size_t i = 0; i < list.size(); ++i) {
    const ProtocolLimits& mine = l.protocols.at(i);
    cuda_ipc::ProtocolRegion r;
    if (mine.max_bytes > 0 && list[i].has_region()) {
      r.bytes = list[i].region_bytes(l.nranks, mine);
      r.param = list[i].region_param(l.nranks, mine);
      if (list[i].probe) r.probe = list[i].probe(l.nranks, mine);
    }
    out.push_back(r);
  }
  return out;
}

bool register_all_reduce_launcher(const char* name, const AllReduceLauncher& l) {
  launchers()[name] = l;
  return true;
}

const AllReduceLauncher* all_reduce_launcher(int protocol) {
  const auto& list = protocols();
  if (protocol < 0 || protocol >= int(list.size())) return nullptr;
  auto it = launchers().find(list[protocol].name);
  return it == launchers().end() ? nullptr : &it->second;
}

bool registered_launchers_support_early_launch() {
  for (int i = 0; i < int(protocols().size()); ++i) {
    const AllReduceLauncher* l = all_reduce_launcher(i);
    if (l == nullptr || l->supports_early_launch == nullptr || !l->supports_early_launch()) return false;
  }
  return true;
}

}  // namespace gpu
}  // namespace pycoll

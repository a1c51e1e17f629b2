#include "cuda/all_reduce_plan.h"

#include <stdexcept>

#include "common/arith.h"
#include "cuda/all_reduce_registry.h"
#include "cuda/select.h"

namespace pycoll {
namespace gpu {

const char* AllReducePlan::protocol_name() const {
  return protocol < 0 ? "none" : all_reduce_protocols().at(size_t(protocol)).name;
}

std::string AllReducePlan::describe() const {
  std::string s = std::string(algo == Algo::Tree ? "double_binary_tree" : algo_name(algo)) + " " + protocol_name();
  if (*variant) s += std::string(" ") + variant;
  if (protocol < 0) return s;
  s += " grid=" + std::to_string(grid);
  if (chunk > 0) s += " chunk=" + std::to_string(chunk);
  if (seg > 0) s += " seg=" + std::to_string(seg);
  return s;
}

int64_t two_shot_segment(int64_t count, int64_t es, int nranks) { return round_up(ceil_div(count, nranks), 16 / es); }

AllReducePlan plan_all_reduce(int64_t count, int64_t es, Algo requested, const EngineLimits& l) {
  AllReducePlan p;
  const int64_t bytes = count * es;
  p.algo = requested == Algo::Auto ? choose_all_reduce(bytes, l.nranks, limited_protocol_max_bytes(l, Algo::TwoShot))
                                   : requested;
  if (count == 0 || l.nranks == 1) return p;  // nothing to launch
  const auto& protocols = all_reduce_protocols();
  for (size_t i = 0; i < protocols.size(); ++i) {
    const AllReduceProtocol& r = protocols[i];
    if (!r.runs(p.algo) || l.protocols.at(i).max_bytes <= 0) continue;
    AllReducePlan q = p;
    q.protocol = int(i);
    if (r.check_code != 0) q.check = static_cast<cuda_ipc::CheckPlan>(r.check_code);
    if (r.plan(q, count, es, l, l.protocols[i])) return q;
  }
  throw std::invalid_argument(std::string("the CUDA engine has no all_reduce algorithm '") + algo_name(p.algo) + "'");
}

}  // namespace gpu
}  // namespace pycoll

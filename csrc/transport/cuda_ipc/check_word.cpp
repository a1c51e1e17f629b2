// Error text for collective check words (check_word.h). Plain C++: built without CUDA too, so that
// the encoding and its messages are tested on machines without a GPU.
#include "transport/cuda_ipc/check_word.h"

#include <map>
#include <sstream>

#include "common/types.h"

namespace pycoll {
namespace cuda_ipc {

namespace {
std::map<int, const char*>& registered_names() {  // filled by static initializers: built on first use
  static std::map<int, const char*> m;
  return m;
}
}  // namespace

void register_check_plan_name(int plan, const char* name) { registered_names()[plan] = name; }

bool check_plan_taken(int plan) {
  return (plan >= 0 && plan <= int(CheckPlan::Direct)) || registered_names().count(plan) > 0;
}

const char* check_plan_name(int plan) {
  const auto it = registered_names().find(plan);
  if (it != registered_names().end()) return it->second;
  switch (static_cast<CheckPlan>(plan)) {
    case CheckPlan::Unspecified: return "";
    case CheckPlan::OneShot: return "one-shot";
    case CheckPlan::TwoShot: return "two-shot";
    case CheckPlan::Ring: return "ring";
    case CheckPlan::Tree: return "tree";
    case CheckPlan::SplitStatic: return "split one-shot (static ranges)";
    case CheckPlan::SplitClaimed: return "split one-shot (claimed chunks)";
    case CheckPlan::LL: return "one-shot (LL protocol)";
    case CheckPlan::Direct: return "direct";
    case CheckPlan::OtherSchedule: return "another schedule program (its digest differs)";
    case CheckPlan::Schedule: return "schedule program";
  }
  return "unknown plan";
}

std::string describe_check(const CollectiveCheck& c) {
  // kernels::ReduceOp's order (AVG runs as sum, bool ops as bitwise ones).
  static const char* const kReduceNames[] = {"sum", "product", "min", "max", "band", "bor", "bxor"};
  std::ostringstream os;
  const auto op = static_cast<OpCode>(c.op);
  os << op_name(op);
  if (op == OpCode::AllGather || op == OpCode::Broadcast) {
    os << " of " << c.count << " bytes";
  } else if (op == OpCode::AllReduce || op == OpCode::ReduceScatter || op == OpCode::Reduce) {
    os << " of " << c.count << (op == OpCode::ReduceScatter ? " elements per rank" : " elements") << " of "
       << dtype_name(static_cast<DType>(c.dtype)) << " ("
       << (c.reduce_op >= 0 && c.reduce_op < 7 ? kReduceNames[c.reduce_op] : "?") << ")";
  }
  if (op == OpCode::AllToAll && c.count > 0) os << " sending " << c.count << " bytes from one rank to the other";
  if (op == OpCode::Broadcast || op == OpCode::Reduce) os << " with root " << c.root;
  const char* plan = check_plan_name(c.plan);
  if (*plan != '\0') os << ", " << plan;
  return os.str();
}

}  // namespace cuda_ipc
}  // namespace pycoll

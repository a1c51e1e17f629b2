#include "engines/call_check.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace pycoll {

namespace {

// Signature layout: op, dtype, elements, reduce op, root, then (all_to_all) the bytes this rank
// sends to and receives from each of the group's ranks.
constexpr int64_t kFixed = 5;

int64_t elements_of(const Collective& c) {
  switch (c.op) {
    case OpCode::Broadcast:
    case OpCode::Scatter: return c.output.defined() ? c.output.numel() : -1;
    case OpCode::AllToAll:
    case OpCode::Barrier: return 0;  // all_to_all: the splits below say it
    default: return c.input.defined() ? c.input.numel() : -1;
  }
}

bool has_reduce(OpCode op) { return op == OpCode::AllReduce || op == OpCode::ReduceScatter || op == OpCode::Reduce; }
bool has_root(OpCode op) {
  return op == OpCode::Broadcast || op == OpCode::Reduce || op == OpCode::Gather || op == OpCode::Scatter;
}

std::string describe(const int64_t* s) {
  const OpCode op = static_cast<OpCode>(s[0]);
  std::ostringstream o;
  o << op_name(op);
  if (op == OpCode::Barrier) return o.str();
  if (op != OpCode::AllToAll) o << " of " << s[2] << " elements";
  o << " of " << c10::toString(static_cast<at::ScalarType>(s[1]));
  if (has_reduce(op)) o << " (" << reduce_name(static_cast<ReduceKind>(s[3])) << ")";
  if (has_root(op)) o << " with root " << s[4];
  return o.str();
}

}  // namespace

CallCheck::CallCheck(const c10::intrusive_ptr<c10d::Backend>& group, const Collective& c, int group_size,
                     std::function<std::string(int)> member_name)
    : name_of_(std::move(member_name)), group_size_(group_size) {
  const int64_t len = kFixed + 2 * int64_t(group_size);
  mine_ = at::zeros({len}, at::kLong);
  int64_t* s = mine_.data_ptr<int64_t>();
  const at::Tensor& ref = c.input.defined() ? c.input : c.output;
  s[0] = int64_t(c.op);
  s[1] = ref.defined() ? int64_t(ref.scalar_type()) : -1;
  s[2] = elements_of(c);
  s[3] = has_reduce(c.op) ? int64_t(c.reduce) : -1;
  s[4] = has_root(c.op) ? c.root : -1;
  if (c.op == OpCode::AllToAll) {
    for (int r = 0; r < group_size; ++r) {
      s[kFixed + r] = c.splits.send_bytes[r];
      s[kFixed + group_size + r] = c.splits.recv_bytes[r];
    }
  }
  all_ = at::empty({group->getSize() * len}, at::kLong);
  work_ = group->_allgather_base(all_, mine_, c10d::AllgatherOptions());
}

void CallCheck::finish() {
  work_->wait();
  const int64_t len = mine_.numel();
  const int64_t* mine = mine_.data_ptr<int64_t>();
  const int64_t* all = all_.data_ptr<int64_t>();
  const int members = int(all_.numel() / len);
  for (int m = 0; m < members; ++m) {
    const int64_t* theirs = all + m * len;
    if (!std::equal(mine, mine + kFixed, theirs)) {
      TORCH_CHECK(false, "pycoll::", op_name(static_cast<OpCode>(mine[0])),
                  ": the ranks of this group called different collectives across hosts: this rank called ",
                  describe(mine), ", ", name_of_(m), " called ", describe(theirs));
    }
  }
  if (static_cast<OpCode>(mine[0]) != OpCode::AllToAll) return;
  // all_to_all: what rank i sends to rank j must be what j receives from i. The members are
  // the group's ranks here (all_to_all runs on the flat group).
  const int n = group_size_;
  for (int i = 0; i < members; ++i) {
    for (int j = 0; j < members; ++j) {
      const int64_t sent = all[i * len + kFixed + j], received = all[j * len + kFixed + n + i];
      TORCH_CHECK(sent == received, "pycoll::alltoall: mismatched splits across hosts: ", name_of_(i), " sends ", sent,
                  " bytes to ", name_of_(j), ", which expects ", received);
    }
  }
}

}  // namespace pycoll

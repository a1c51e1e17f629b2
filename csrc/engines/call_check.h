// Across hosts, every rank's call is compared with its peers' on the inter-host group before any
// data crosses hosts. Inside a host our engines compare calls themselves (the CPU engine's op
// header, the CUDA engine's check word), but between hosts the data goes through Gloo, which
// aborts the whole process (an exception on its own thread) when the ranks of one collective
// pass different sizes. A mismatch must therefore be caught before Gloo sees it, and raised as
// an error that names both calls.
//
// The exchange is one all-gather of a few int64s per rank on the flat inter-host group, whatever
// the op (so that two different ops meet in one exchange); the hierarchical all_reduce starts it
// before its local phase so that the two overlap. Every signature has the same length on every
// rank, whatever the op.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <string>

#include "engines/engine.h"

namespace pycoll {

class CallCheck {
 public:
  // Starts the exchange of `c`'s signature among `group`'s members. `group_size` is the size of
  // the pycoll group (all_to_all's splits are part of the signature); `member_name` names a
  // member of `group` in error messages (e.g. "rank 2 (host 1)"), called only for an error.
  CallCheck(const c10::intrusive_ptr<c10d::Backend>& group, const Collective& c, int group_size,
            std::function<std::string(int)> member_name);
  // Waits for every member's signature; throws (c10::Error, RuntimeError in Python) naming this
  // rank's call and the first that differs.
  void finish();

 private:
  at::Tensor mine_;
  at::Tensor all_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<std::string(int)> name_of_;
  int group_size_;
};

}  // namespace pycoll

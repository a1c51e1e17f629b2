// The engines' key-value store (common/rendezvous.h) on a c10d Store.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

#include "common/rendezvous.h"

namespace pycoll {

// Every call takes the GIL: the Store handed to a backend may be implemented in Python (or wrap
// one), and calling into it without the GIL crashes. `prefix` is unique per group.
Rendezvous make_rendezvous(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix);

}  // namespace pycoll

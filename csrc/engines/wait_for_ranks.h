// Waiting on the Store for one key per rank of a group, with an error that says which ranks never
// came. An engine that maps every peer's memory (the CUDA engine) is made by all ranks of its group
// together; a rank that never arrives is the usual sign of a program whose first op on the group is
// not one every rank issues (a send between two of three ranks), not of a crash, and the Store's
// own timeout error names only keys.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace pycoll {

// Blocks until keys[r] exists for every r (keys[r] is rank r's), at most `timeout`. On timeout
// raises DistBackendError: "<what>: rank(s) 1, 3 of this group of 4 did not arrive within the
// group's timeout (60000 ms)", then `why` (what the ranks were waiting for and the cure).
void wait_for_every_rank(c10d::Store& store, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                         const std::string& what, const std::string& why);

}  // namespace pycoll

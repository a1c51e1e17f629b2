// Waiting on the Store for one key per rank, with an error that names the ranks that never set
// theirs: the Store's own timeout error names only keys.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace pycoll {

// Blocks until keys[r] exists for every r (keys[r] is rank r's), at most `timeout`. On timeout
// raises DistBackendError: "<what>: ranks 1, 3 of 4 did not arrive within the group's timeout
// (60000 ms). <why>" (`why`: what the ranks were waiting for and what to do). When the wait
// failed yet every key is there (it arrived as the wait gave up), returns; when the Store itself
// fails, its error stands.
void wait_for_every_rank(c10d::Store& store, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                         const std::string& what, const std::string& why);

}  // namespace pycoll

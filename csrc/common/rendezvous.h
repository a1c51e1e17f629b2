// The key-value store seen by transports, without torch types, so that a
// transport can be built and tested without the c10d Store.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pycoll {

struct Rendezvous {
  std::function<void(const std::string& key, const std::string& value)> set;
  // Blocks until the key exists (the Store's own timeout applies).
  std::function<std::string(const std::string& key)> get;
  std::function<int64_t(const std::string& key, int64_t delta)> add;
  // Blocks until keys[r] exists for every rank r, at most `timeout`; then raises an error that
  // names the ranks whose key is missing, with `what` failed and `why` (what to do).
  std::function<void(const std::vector<std::string>& keys, std::chrono::milliseconds timeout, const std::string& what,
                     const std::string& why)>
      wait_every_rank;
  std::string prefix;  // unique per group
};

}  // namespace pycoll

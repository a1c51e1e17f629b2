// The key-value store seen by transports, without torch types, so that a
// transport can be built and tested without the c10d Store.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace pycoll {

struct Rendezvous {
  std::function<void(const std::string& key, const std::string& value)> set;
  // Blocks until the key exists (the Store's own timeout applies).
  std::function<std::string(const std::string& key)> get;
  std::function<int64_t(const std::string& key, int64_t delta)> add;
  std::string prefix;  // unique per group
};

}  // namespace pycoll

// Error helpers. Errors are exceptions (c10::Error through TORCH_CHECK, which
// reaches Python as RuntimeError); the library never exits or aborts.
#pragma once

#include <c10/util/Exception.h>

#include <sstream>
#include <string>

namespace pycoll {

// Builds a message from streamable parts: str("rank ", r, " sent ", n).
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Raised when the group cannot continue (peer died, timed out); later ops
// fail fast with the original reason instead of hanging.
struct GroupBroken : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace pycoll

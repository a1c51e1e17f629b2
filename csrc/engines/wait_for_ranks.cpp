#include "engines/wait_for_ranks.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace pycoll {

void wait_for_every_rank(c10d::Store& store, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                         const std::string& what, const std::string& why) {
  try {
    store.wait(keys, timeout);
    return;
  } catch (const c10::Error&) {
    // Which keys are missing tells the ranks apart; if none is (the wait failed another way), the
    // Store's own error is the better one.
    std::vector<int> missing;
    for (size_t r = 0; r < keys.size(); ++r) {
      if (!store.check({keys[r]})) missing.push_back(static_cast<int>(r));
    }
    if (missing.empty()) throw;
    std::ostringstream os;
    os << what << ": rank" << (missing.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
    os << " of this group of " << keys.size() << " did not arrive within the group's timeout (" << timeout.count()
       << " ms). " << why;
    C10_THROW_ERROR(DistBackendError, os.str());
  }
}

}  // namespace pycoll

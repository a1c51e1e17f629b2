#include "common/store_wait.h"

#include <c10/util/Exception.h>

#include <exception>
#include <sstream>

namespace pycoll {

void wait_for_every_rank(c10d::Store& store, const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                         const std::string& what, const std::string& why) {
  try {
    store.wait(keys, timeout);
    return;
  } catch (const c10::Error&) {
    // The timeout is DistStoreError or a plain c10::Error, by Store. Which keys are missing tells
    // the ranks apart; if check() fails too, the Store is gone and its first error says more.
    const std::exception_ptr waited = std::current_exception();
    std::vector<int> missing;
    try {
      for (size_t r = 0; r < keys.size(); ++r) {
        if (!store.check({keys[r]})) missing.push_back(static_cast<int>(r));
      }
    } catch (const c10::Error&) {
      std::rethrow_exception(waited);
    }
    if (missing.empty()) return;
    std::ostringstream os;
    os << what << ": rank" << (missing.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
    os << " of " << keys.size() << " did not arrive within the group's timeout (" << timeout.count() << " ms). " << why;
    C10_THROW_ERROR(DistBackendError, os.str());
  }
}

}  // namespace pycoll

#include "common/test_hooks.h"

#include <atomic>
#include <thread>

namespace pycoll::test_hooks {

namespace {
std::atomic<int64_t> g_linger_ms{0};
}  // namespace

std::chrono::milliseconds thread_linger() { return std::chrono::milliseconds(g_linger_ms.load()); }

void set_thread_linger(std::chrono::milliseconds ms) { g_linger_ms.store(ms.count()); }

void linger_if_set() {
  const auto ms = thread_linger();
  if (ms.count() > 0) std::this_thread::sleep_for(ms);
}

}  // namespace pycoll::test_hooks

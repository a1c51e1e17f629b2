#include "common/test_hooks.h"

#include <atomic>
#include <thread>

namespace pycoll::test_hooks {

namespace {
std::atomic<int64_t> g_linger_ms{0};
std::atomic<bool> g_deny_peer_read{false};
std::atomic<bool> g_deny_shared_open{false};
}  // namespace

std::chrono::milliseconds thread_linger() { return std::chrono::milliseconds(g_linger_ms.load()); }

void set_thread_linger(std::chrono::milliseconds ms) { g_linger_ms.store(ms.count()); }

void linger_if_set() {
  const auto ms = thread_linger();
  if (ms.count() > 0) std::this_thread::sleep_for(ms);
}

bool deny_peer_read() { return g_deny_peer_read.load(std::memory_order_relaxed); }

void set_deny_peer_read(bool deny) { g_deny_peer_read.store(deny); }

bool deny_shared_open() { return g_deny_shared_open.load(std::memory_order_relaxed); }

void set_deny_shared_open(bool deny) { g_deny_shared_open.store(deny); }

}  // namespace pycoll::test_hooks

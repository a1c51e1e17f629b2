#include "common/test_hooks.h"

#include <atomic>
#include <thread>

namespace pycoll::test_hooks {

namespace {
std::atomic<int64_t> g_linger_ms{0};
std::atomic<bool> g_deny_peer_read{false};
std::atomic<bool> g_deny_shared_open{false};
std::atomic<int64_t> g_shared_votes{0};
std::atomic<int64_t> g_p2p_by_reference{0};
std::atomic<int64_t> g_p2p_into_receiver{0};
std::atomic<int64_t> g_streamed_bytes{0};
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

void count_shared_vote() { g_shared_votes.fetch_add(1, std::memory_order_relaxed); }

int64_t shared_votes() { return g_shared_votes.load(std::memory_order_relaxed); }

void count_p2p_by_reference() { g_p2p_by_reference.fetch_add(1, std::memory_order_relaxed); }

int64_t p2p_by_reference() { return g_p2p_by_reference.load(std::memory_order_relaxed); }

void count_p2p_into_receiver() { g_p2p_into_receiver.fetch_add(1, std::memory_order_relaxed); }

int64_t p2p_into_receiver() { return g_p2p_into_receiver.load(std::memory_order_relaxed); }

void count_streamed_bytes(int64_t bytes) { g_streamed_bytes.fetch_add(bytes, std::memory_order_relaxed); }

int64_t streamed_bytes() { return g_streamed_bytes.load(std::memory_order_relaxed); }

}  // namespace pycoll::test_hooks

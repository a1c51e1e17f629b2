// dist.monitored_barrier, Gloo's debugging barrier: rank 0 waits for every rank in turn and names
// the ones that did not arrive in time (the first, or with wait_all_ranks every one), where a plain
// barrier would leave every rank waiting with nothing to say. It runs on the group's Store, not on
// the engine: it is what people call when a rank may be stuck inside a collective, and such a rank
// holds the engine. The messages are Gloo's, which torch's tests and users' log searches match.
#include "backend/process_group.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common/check.h"

namespace pycoll {
namespace {

using Clock = std::chrono::steady_clock;

// True once `key` exists, waiting until `deadline` at most. A Store's wait(keys, 0 ms) means "no
// limit", so a deadline that has passed only checks.
bool appears_by(c10d::Store& store, const std::string& key, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return store.check({key});
  try {
    store.wait({key}, left);
    return true;
  } catch (const c10::Error&) {  // its timeout ("Wait timeout": DistStoreError or a plain c10::Error,
    return store.check({key});   // by Store); a Store that is gone throws from check() as well
  }
}

void forget(c10d::Store& store, const std::string& key) {
  try {
    store.deleteKey(key);
  } catch (const c10::Error&) {  // a Store without deleteKey keeps a few bytes per barrier
  }
}

std::string joined(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

void ProcessGroupPycoll::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  check_usable("pycoll::monitored_barrier");
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const auto deadline = Clock::now() + timeout;
  // Every rank calls monitored barriers in the same order, so the count names this one everywhere.
  const uint64_t n = monitored_barriers_++;
  const std::string base = "pycoll/" + group_name_ + "/monitored_barrier/";
  const auto arrived = [&](uint64_t k, int r) { return base + std::to_string(k) + "/arrived/" + std::to_string(r); };
  const auto release = [&](uint64_t k) { return base + std::to_string(k) + "/release"; };
  static const std::string kOk = "ok";

  if (rank_ != 0) {
    store_->set(arrived(n, rank_), std::vector<uint8_t>{1});
    std::string why;
    // Rank 0 answers once its own deadline passes (the ranks' clocks started at about the same time):
    // the grace lets its answer arrive, so a rank that came learns who did not.
    const auto grace = std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(1));
    if (!appears_by(*store_, release(n), deadline + grace)) {
      why = str("no answer from rank 0 within ", (timeout + grace).count(), " ms");
    } else {
      const auto word = store_->get(release(n));
      if (std::string(word.begin(), word.end()) != kOk) why = std::string(word.begin(), word.end());
    }
    if (!why.empty()) {
      C10_THROW_ERROR(DistBackendError,
                      str("Rank ", rank_, " successfully reached monitoredBarrier, but received errors while waiting ",
                          "for send/recv from rank 0. Please check rank 0 logs for faulty rank (", why, ")"));
    }
    return;
  }

  std::vector<int> missing;
  std::string failure;
  for (int r = 1; r < size_ && failure.empty(); ++r) {
    const bool late_before_waiting = Clock::now() >= deadline && missing.empty();
    if (appears_by(*store_, arrived(n, r), deadline)) continue;
    missing.push_back(r);
    if (wait_all_ranks) continue;
    failure = late_before_waiting ? str("Rank 0 timed out in monitoredBarrier after ", timeout.count(), " ms; rank ", r,
                                        " had not arrived")
                                  : str("Rank ", r, " failed to pass monitoredBarrier in ", timeout.count(), " ms");
  }
  if (failure.empty() && !missing.empty()) {
    failure = str("Ranks ", joined(missing), " failed to pass monitoredBarrier in ", timeout.count(), " ms");
  }
  if (!failure.empty()) {
    store_->set(release(n), std::vector<uint8_t>(failure.begin(), failure.end()));  // the others fail now
    C10_THROW_ERROR(DistBackendError, failure);
  }
  // Every rank has passed barrier n - 1 (each arrived here after reading its release).
  for (int r = 1; r < size_; ++r) forget(*store_, arrived(n, r));
  if (n > 0) forget(*store_, release(n - 1));
  store_->set(release(n), std::vector<uint8_t>(kOk.begin(), kOk.end()));
}

}  // namespace pycoll

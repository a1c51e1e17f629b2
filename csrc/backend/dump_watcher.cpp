#include "backend/dump_watcher.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/flight_recorder.h"
#include "common/env.h"
#include "common/setting.h"

namespace pycoll {

namespace {

const IntSetting kDumpSignal("PYCOLL_FR_DUMP_SIGNAL", 0, 0, 64, "backend", false, Audience::User,
                             "A signal number (e.g. 10 for SIGUSR1) on which every process writes its flight "
                             "recorder dump (docs/tracing.md); 0: none.",
                             "0 (none)");
const IntSetting kDumpOnError("PYCOLL_FR_DUMP_ON_ERROR", 1, 0, 1, "backend", false, Audience::User,
                              "1: when an op fails (timeout, dead peer, mismatched call, abort), the rank dumps its "
                              "flight recorder and asks every rank of the group to dump theirs (docs/tracing.md).");

const TextSetting kDumpPipe("PYCOLL_FR_DUMP_PIPE", "", "a path prefix", "backend", false, Audience::User,
                            "A path prefix: each process makes the named pipe <prefix><rank>.pipe and writes its "
                            "flight recorder dump when anything is written into it (echo 1 > <prefix>0.pipe; "
                            "docs/tracing.md); empty: none.");

// The named pipe of PYCOLL_FR_DUMP_PIPE, read without blocking by the watcher's loop, removed when
// the last group is destroyed (or at exit). Used under DumpWatcher's lock; never destroyed: the
// detached loop may run until exit.
class DumpPipe {
 public:
  // Makes the pipe once this process knows its rank.
  void open_when_ready(int rank) {
    if (tried_ || rank < 0) return;
    tried_ = true;
    const std::string prefix = kDumpPipe.get();
    if (prefix.empty()) return;
    const std::string path = prefix + std::to_string(rank) + ".pipe";
    if (path.size() >= sizeof(made_)) return;
    if (::mkfifo(path.c_str(), 0600) != 0 && errno != EEXIST) {
      std::fprintf(stderr, "[pycoll] PYCOLL_FR_DUMP_PIPE: cannot make %s: %s\n", path.c_str(), std::strerror(errno));
      return;
    }
    std::snprintf(made_, sizeof(made_), "%s", path.c_str());
    static const bool at_exit = std::atexit([] {
                                  if (made_[0]) ::unlink(made_);
                                }) == 0;
    (void)at_exit;
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) {
      std::fprintf(stderr, "[pycoll] PYCOLL_FR_DUMP_PIPE: cannot open %s: %s\n", path.c_str(), std::strerror(errno));
    }
  }
  // Closes and removes the pipe; the next open_when_ready makes it again.
  void remove() {
    if (fd_ >= 0) ::close(fd_);
    if (made_[0]) ::unlink(made_);
    made_[0] = '\0';
    fd_ = -1;
    tried_ = false;
  }
  // Whether something was written since the last call (what was written does not matter).
  bool poked() {
    if (fd_ < 0) return false;
    char buf[256];
    bool any = false;
    for (ssize_t n; (n = ::read(fd_, buf, sizeof(buf))) > 0;) any = true;
    return any;
  }

 private:
  static char made_[4096];  // the path to remove at exit
  bool tried_ = false;
  int fd_ = -1;
};
char DumpPipe::made_[4096] = {};
DumpPipe& pipe_file() {
  static DumpPipe* pipe = new DumpPipe();
  return *pipe;
}

// Store keys, on each group's own (prefixed) Store.
constexpr const char* kRequestCount = "pycoll/fr/dump_requests";
constexpr const char* kRequestReason = "pycoll/fr/dump_reason";
constexpr auto kStorePoll = std::chrono::seconds(1);
constexpr auto kTick = std::chrono::milliseconds(100);

std::atomic<bool> signalled{false};
void on_signal(int) { signalled.store(true); }

// A Store whose calls need no GIL: C++ all the way down.
bool native(const c10::intrusive_ptr<c10d::Store>& store) {
  c10d::Store* s = store.get();
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(s)) s = prefixed->getUnderlyingNonPrefixStore().get();
  return dynamic_cast<c10d::TCPStore*>(s) != nullptr || dynamic_cast<c10d::FileStore*>(s) != nullptr ||
         dynamic_cast<c10d::HashStore*>(s) != nullptr;
}

}  // namespace

DumpWatcher& DumpWatcher::get() {
  static DumpWatcher* watcher = new DumpWatcher();  // never destroyed: its thread runs until exit
  return *watcher;
}

void DumpWatcher::ensure_thread() {
  if (started_) return;
  started_ = true;
  if (const int sig = static_cast<int>(kDumpSignal.get()); sig > 0) {
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, nullptr);
  }
  std::thread([this] { loop(); }).detach();
}

void DumpWatcher::watch(int pg_id, const c10::intrusive_ptr<c10d::Store>& store) {
  if (!FlightRecorder::get().enabled()) return;
  std::lock_guard<std::mutex> g(mu_);
  Watched w;
  if (native(store)) w.store = store;
  groups_[pg_id] = std::move(w);
  ensure_thread();
}

void DumpWatcher::unwatch(int pg_id) {
  std::lock_guard<std::mutex> g(mu_);
  groups_.erase(pg_id);
  if (groups_.empty()) pipe_file().remove();
}

void DumpWatcher::op_failed(int pg_id, const std::string& reason) {
  if (!FlightRecorder::get().enabled() || kDumpOnError.get() == 0) return;
  std::lock_guard<std::mutex> g(mu_);
  auto it = groups_.find(pg_id);
  if (it == groups_.end() || it->second.failed) return;
  it->second.failed = true;
  failures_.push_back({pg_id, reason, it->second.store});
  cv_.notify_all();
}

uint64_t DumpWatcher::dumps_written() const {
  std::lock_guard<std::mutex> g(mu_);
  return dumps_;
}

void DumpWatcher::dump(const std::string& reason) {
  try {
    const std::string path = FlightRecorder::get().dump_to_file("", reason);
    if (debug_info_enabled())
      std::fprintf(stderr, "[pycoll] flight recorder dumped to %s (%s)\n", path.c_str(), reason.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[pycoll] flight recorder: %s\n", e.what());
  }
  std::lock_guard<std::mutex> g(mu_);
  ++dumps_;
}

void DumpWatcher::loop() {
  auto next_poll = std::chrono::steady_clock::now();
  for (;;) {
    std::vector<Failure> failures;
    {
      std::unique_lock<std::mutex> g(mu_);
      cv_.wait_for(g, kTick, [this] { return !failures_.empty(); });
      failures.assign(failures_.begin(), failures_.end());
      failures_.clear();
    }
    if (signalled.exchange(false)) dump("signal");
    bool poked = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!groups_.empty()) {
        pipe_file().open_when_ready(FlightRecorder::get().process_rank());
        poked = pipe_file().poked();
      }
    }
    if (poked) dump("pipe");
    for (const auto& [pg_id, reason, store] : failures) {
      const int rank = FlightRecorder::get().process_rank();
      dump("error: " + reason);
      if (!store) continue;
      try {
        const std::string why = "rank " + std::to_string(rank) + ": " + reason;
        store->set(kRequestReason, std::vector<uint8_t>(why.begin(), why.end()));
        const int64_t n = store->add(kRequestCount, 1);
        std::lock_guard<std::mutex> g(mu_);
        auto it = groups_.find(pg_id);
        if (it != groups_.end()) it->second.requests_seen = n;  // our own request: answered above
      } catch (const std::exception&) {
        // The Store is gone (its host exited): the peers cannot be asked.
      }
    }
    if (std::chrono::steady_clock::now() < next_poll) continue;
    next_poll = std::chrono::steady_clock::now() + kStorePoll;
    std::vector<std::pair<int, c10::intrusive_ptr<c10d::Store>>> stores;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const auto& [pg_id, w] : groups_)
        if (w.store) stores.emplace_back(pg_id, w.store);
    }
    std::string request;
    for (const auto& [pg_id, store] : stores) {
      try {
        const int64_t n = store->add(kRequestCount, 0);
        bool fresh = false;
        {
          std::lock_guard<std::mutex> g(mu_);
          auto it = groups_.find(pg_id);
          if (it != groups_.end() && n > it->second.requests_seen) {
            it->second.requests_seen = n;
            fresh = true;
          }
        }
        if (fresh && request.empty()) {
          const std::vector<uint8_t> why = store->get(kRequestReason);
          request = "peer request: " + std::string(why.begin(), why.end());
        }
      } catch (const std::exception&) {
        // A Store that stopped answering (its host exited) is not asked again.
        std::lock_guard<std::mutex> g(mu_);
        auto it = groups_.find(pg_id);
        if (it != groups_.end()) it->second.store.reset();
      }
    }
    if (!request.empty()) dump(request);
  }
}

}  // namespace pycoll

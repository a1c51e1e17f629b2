// When the flight recorder is written to disk: one background thread per process that dumps it
//   - when an op of this process fails (a timeout, a dead peer, a mismatched call, an abort while
//     waiting), and then asks every rank of that group to dump too, through the group's Store;
//   - when a peer asks (it polls each group's Store once a second), so that a rank busy in Python
//     or stuck in another collective leaves its dump as well;
//   - on a signal (PYCOLL_FR_DUMP_SIGNAL), or when something is written into its named pipe
//     (PYCOLL_FR_DUMP_PIPE: <prefix><rank>.pipe, read every 100 ms).
// Dumps happen on this thread, never on the engine thread that failed. On-demand dumps
// (pycollectives.trace.dump) write directly.
//
// Only Stores implemented in C++ (TCPStore, FileStore, HashStore and PrefixStores over them) are
// polled: a Store written in Python needs the GIL, which a rank stuck in Python holds.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace pycoll {

class DumpWatcher {
 public:
  static DumpWatcher& get();

  // A group's Store, polled for peers' dump requests until unwatch(pg_id) (the group's shutdown,
  // abort or destruction).
  void watch(int pg_id, const c10::intrusive_ptr<c10d::Store>& store);
  void unwatch(int pg_id);
  // An op of group pg_id failed with `reason`: dump here and ask the group's ranks to dump (once
  // per group: the group is unusable after its first failure).
  void op_failed(int pg_id, const std::string& reason);
  // Dumps written by this thread so far (tests wait on it).
  uint64_t dumps_written() const;

 private:
  DumpWatcher() = default;
  void ensure_thread();  // mu_ held
  void loop();
  void dump(const std::string& reason);

  struct Watched {
    c10::intrusive_ptr<c10d::Store> store;  // null: a Store in Python, not polled
    int64_t requests_seen = 0;              // peers' requests already answered
    bool failed = false;                    // this process already reported a failure of the group
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, Watched> groups_;
  // A failed op to dump and announce, with its group's Store as it was then (the group may be
  // shut down, and unwatched, before this thread gets to it).
  struct Failure {
    int pg_id;
    std::string reason;
    c10::intrusive_ptr<c10d::Store> store;
  };
  std::deque<Failure> failures_;
  uint64_t dumps_ = 0;
  bool started_ = false;
};

}  // namespace pycoll

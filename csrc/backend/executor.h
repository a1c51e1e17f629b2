// Runs a group's collectives one at a time, in the order they were issued
// (every rank issues them in the same order, so every rank runs them in the
// same order), on one engine thread. A blocking call (async_op=False) finding
// the engine idle runs on the caller's thread instead, which saves two thread
// hand-offs on small messages. CompletionPool runs Future callbacks on
// threads of their own (see work.h for why).
//
// Teardown may happen on the engine thread itself (it dropped the last
// reference to the group with a finished task): the thread's state is shared
// with the thread, which the destructor then detaches (common/owned_thread.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pycoll {

class SerialExecutor {
 public:
  // `idle_poll`: how long the engine thread polls for the next task before it sleeps (0: never).
  explicit SerialExecutor(std::chrono::microseconds idle_poll = std::chrono::microseconds(0));
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Returns true if the task ran inline (already finished) on this thread.
  bool submit(std::function<void()> task, bool inline_ok);
  // True while this thread runs a task inline (nobody can hold its Future yet).
  static bool running_inline();
  // Runs what is queued, then ends the engine thread. Safe on any thread, the engine's own included.
  void stop();

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    std::atomic<size_t> queued{0};  // queue.size(), readable without mu (what the idle poll reads)
    bool busy = false;
    bool stop = false;
    std::chrono::microseconds idle_poll{0};
  };
  // Touches only `s` (never the executor): the executor may be destroyed while a task's last
  // references are being dropped on this thread.
  static void loop(const std::shared_ptr<State>& s);
  std::shared_ptr<State> state_;
  std::thread thread_;
};

class CompletionPool {
 public:
  static CompletionPool& instance();
  void post(std::function<void()> fn);
  ~CompletionPool();

 private:
  CompletionPool() = default;
  // `extra`: a thread started beyond kStartThreads because every thread was busy; it ends after
  // kExtraIdle without work, so a burst does not leave the process a thread larger for good.
  void loop(bool extra);
  void start_thread(bool extra);  // under mu_
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  static constexpr int kStartThreads = 4;
  static constexpr int kMaxThreads = 256;
  static constexpr std::chrono::milliseconds kExtraIdle{200};
  int threads_ = 0;  // running (detached)
  int idle_ = 0;
  int starting_ = 0;  // started, not yet waiting for work
  bool stop_ = false;
};

// Waits, at most `bound`, until no engine thread has a task queued or running and no completion is
// queued or running; false if the bound passed first. pycollectives calls it at interpreter exit
// (atexit, before finalization): a background thread that drops the last reference to a tensor
// Python has seen takes the GIL, and during finalization CPython ends such a thread with
// pthread_exit, whose unwinding through the (noexcept) destructor calls std::terminate
// ("terminate called without an active exception", seen at exit without destroy_process_group).
bool wait_for_background_work(std::chrono::milliseconds bound);

// Counts as background work while it lives (for work queued elsewhere, e.g. a point-to-point
// request on a lane thread of the CPU engine): declare it first in what the queue holds, so that
// it goes last.
class BackgroundWork {
 public:
  BackgroundWork();
  ~BackgroundWork();
  BackgroundWork(const BackgroundWork&) = delete;
  BackgroundWork& operator=(const BackgroundWork&) = delete;
};

}  // namespace pycoll

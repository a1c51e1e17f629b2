#include "backend/executor.h"

#include <atomic>

#include "common/brief_spin.h"
#include "common/owned_thread.h"
#include "common/test_hooks.h"

namespace pycoll {

namespace {
thread_local bool t_running_inline = false;
// Engine-thread tasks and completions queued or running, captures not yet dropped.
std::atomic<int64_t> g_background{0};
}  // namespace

BackgroundWork::BackgroundWork() { g_background.fetch_add(1); }
BackgroundWork::~BackgroundWork() { g_background.fetch_sub(1); }

bool wait_for_background_work(std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (g_background.load() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

bool SerialExecutor::running_inline() { return t_running_inline; }

SerialExecutor::SerialExecutor(std::chrono::microseconds idle_poll) : state_(std::make_shared<State>()) {
  state_->idle_poll = idle_poll;
  thread_ = std::thread([s = state_] { loop(s); });
}

SerialExecutor::~SerialExecutor() { stop(); }

void SerialExecutor::stop() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (s.stop) return;
    s.stop = true;
  }
  s.cv.notify_all();
  if (is_current_thread(thread_)) {
    // Called from a task's teardown on the engine thread: no other task runs meanwhile, so the
    // queued ones run here, in order, as the engine thread would have run them before ending.
    for (;;) {
      std::function<void()> task;
      {
        std::lock_guard<std::mutex> g(s.mu);
        if (s.queue.empty()) break;
        task = std::move(s.queue.front());
        s.queue.pop_front();
        s.queued.store(s.queue.size(), std::memory_order_relaxed);
      }
      task();
      task = nullptr;
      g_background.fetch_sub(1);
    }
  }
  join_unless_current(thread_);
}

bool SerialExecutor::submit(std::function<void()> task, bool inline_ok) {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (!(inline_ok && !s.busy && s.queue.empty())) {
      g_background.fetch_add(1);
      s.queue.push_back(std::move(task));
      s.queued.store(s.queue.size(), std::memory_order_release);
      s.cv.notify_one();
      return false;
    }
    s.busy = true;
  }
  t_running_inline = true;
  task();
  t_running_inline = false;
  bool engine_has_work;
  {
    std::lock_guard<std::mutex> g(s.mu);
    s.busy = false;
    engine_has_work = !s.queue.empty() || s.stop;
  }
  // Only the engine thread waits on cv, and only for a queued task or stop: waking it after every
  // inline op cost a futex wake and a context switch per small collective.
  if (engine_has_work) s.cv.notify_all();
  return true;
}

void SerialExecutor::loop(const std::shared_ptr<State>& state) {
  State& s = *state;
  for (;;) {
    std::function<void()> task;
    // A task queued while this thread polls needs no wake-up (notify_one finds no sleeper).
    spin_briefly([&] { return s.queued.load(std::memory_order_acquire) > 0; }, s.idle_poll);
    {
      std::unique_lock<std::mutex> lk(s.mu);
      s.cv.wait(lk, [&] { return (s.stop && s.queue.empty()) || (!s.busy && !s.queue.empty()); });
      if (s.queue.empty()) return;
      task = std::move(s.queue.front());
      s.queue.pop_front();
      s.queued.store(s.queue.size(), std::memory_order_relaxed);
      s.busy = true;
    }
    task();
    test_hooks::linger_if_set();
    // Still busy while the task's captures go: dropping them may destroy the group, and with it
    // this executor (stop() then runs the rest of the queue here).
    task = nullptr;
    g_background.fetch_sub(1);
    {
      std::lock_guard<std::mutex> g(s.mu);
      s.busy = false;  // no notify: only this thread waits on cv
    }
  }
}

CompletionPool& CompletionPool::instance() {
  // Leaked on purpose: threads may still run callbacks while the process exits.
  static CompletionPool* pool = new CompletionPool();
  return *pool;
}

CompletionPool::~CompletionPool() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();  // threads are detached; they exit on their own
}

void CompletionPool::start_thread(bool extra) {
  // The new thread's first step takes mu_, which the caller holds: counting after the thread
  // exists keeps the counts right if starting it throws.
  std::thread([this, extra] { loop(extra); }).detach();
  ++threads_;
  ++starting_;
}

void CompletionPool::post(std::function<void()> fn) {
  std::lock_guard<std::mutex> g(mu_);
  g_background.fetch_add(1);
  queue_.push_back(std::move(fn));
  // Completions come in bursts (a batch of async ops waited together): a few threads from the
  // start absorb them, so the pool does not grow thread by thread while a job runs.
  while (threads_ < kStartThreads) start_thread(/*extra=*/false);
  // A callback may block on a later collective's Future: never let every
  // thread be busy while work is queued. A thread still starting counts as
  // free (it will take work), else bursts of posts start threads that then idle.
  if (queue_.size() > static_cast<size_t>(idle_ + starting_) && threads_ < kMaxThreads) {
    start_thread(/*extra=*/true);
  } else {
    cv_.notify_one();
  }
}

void CompletionPool::loop(bool extra) {
  {
    std::lock_guard<std::mutex> g(mu_);
    --starting_;  // from here on counted in idle_ while it waits
  }
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lk(mu_);
      ++idle_;
      const auto ready = [&] { return stop_ || !queue_.empty(); };
      if (extra) {
        cv_.wait_for(lk, kExtraIdle, ready);
      } else {
        cv_.wait(lk, ready);
      }
      --idle_;
      if (queue_.empty()) {  // stopping, or an extra thread idle for kExtraIdle
        --threads_;
        return;
      }
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
    fn = nullptr;  // the captures go here, still counted
    g_background.fetch_sub(1);
  }
}

}  // namespace pycoll

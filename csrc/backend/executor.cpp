#include "backend/executor.h"

namespace pycoll {

namespace {
thread_local bool t_running_inline = false;
}  // namespace

bool SerialExecutor::running_inline() { return t_running_inline; }

SerialExecutor::SerialExecutor() : thread_([this] { loop(); }) {}

SerialExecutor::~SerialExecutor() { stop(); }

void SerialExecutor::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool SerialExecutor::submit(std::function<void()> task, bool inline_ok) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!(inline_ok && !busy_ && queue_.empty())) {
      queue_.push_back(std::move(task));
      cv_.notify_one();
      return false;
    }
    busy_ = true;
  }
  t_running_inline = true;
  task();
  t_running_inline = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    busy_ = false;
  }
  cv_.notify_all();
  return true;
}

void SerialExecutor::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return (stop_ && queue_.empty()) || (!busy_ && !queue_.empty()); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    task();
    {
      std::lock_guard<std::mutex> g(mu_);
      busy_ = false;
    }
    cv_.notify_all();
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

void CompletionPool::post(std::function<void()> fn) {
  std::lock_guard<std::mutex> g(mu_);
  queue_.push_back(std::move(fn));
  // A callback may block on a later collective's Future: never let every
  // thread be busy while work is queued.
  if (idle_ == 0 && threads_.size() < 256) {
    threads_.emplace_back([this] { loop(); });
    threads_.back().detach();
  } else {
    cv_.notify_one();
  }
}

void CompletionPool::loop() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lk(mu_);
      ++idle_;
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace pycoll

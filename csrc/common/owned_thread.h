// Joining a thread that a backend object owns, from whatever thread destroys the object.
//
// A backend object can be destroyed on one of its own threads: that thread drops the last
// reference to something that keeps the group alive (a tensor whose storage holds a Python object,
// a Future callback's closure holding the group). std::thread::join on the calling thread throws
// std::system_error ("Resource deadlock avoided") and, from a destructor, aborts the process.
// So: join every other thread, detach the calling one. The detached thread must, from then on,
// touch only state it co-owns (a shared_ptr it captured), never the destroyed object.
#pragma once

#include <thread>

namespace pycoll {

// True when the caller is `t` itself.
inline bool is_current_thread(const std::thread& t) { return t.get_id() == std::this_thread::get_id(); }

inline void join_unless_current(std::thread& t) {
  if (!t.joinable()) return;
  if (is_current_thread(t)) {
    t.detach();
  } else {
    t.join();
  }
}

}  // namespace pycoll

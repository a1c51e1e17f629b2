// Releases the GIL for a scope if this thread holds it. For teardown that joins the backend's own
// threads (executor, point-to-point lanes): such a thread may be dropping the last reference to a
// tensor that Python has seen, and that takes the GIL. Joining it with the GIL held deadlocks
// (seen once in CI: rank 0 of test_batch_isend_irecv[4] hung in destroy_process_group).
#pragma once

#include <Python.h>

namespace pycoll {

class ReleaseGilIfHeld {
 public:
  ReleaseGilIfHeld() : state_(Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr) {}
  ~ReleaseGilIfHeld() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  ReleaseGilIfHeld(const ReleaseGilIfHeld&) = delete;
  ReleaseGilIfHeld& operator=(const ReleaseGilIfHeld&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace pycoll

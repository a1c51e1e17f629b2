#include "backend/store_rendezvous.h"

#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "backend/gil_release.h"
#include "common/store_wait.h"

namespace pycoll {

Rendezvous make_rendezvous(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix) {
  Rendezvous rv;
  rv.prefix = prefix;
  rv.set = [store](const std::string& k, const std::string& v) {
    pybind11::gil_scoped_acquire gil;
    store->set(k, std::vector<uint8_t>(v.begin(), v.end()));
  };
  rv.get = [store](const std::string& k) {
    pybind11::gil_scoped_acquire gil;
    auto v = store->get(k);
    return std::string(v.begin(), v.end());
  };
  rv.add = [store](const std::string& k, int64_t d) {
    pybind11::gil_scoped_acquire gil;
    return store->add(k, d);
  };
  // Polls with the GIL held only while it asks: a wait of up to the group's timeout must not stall
  // the process's other Python threads (one of them may issue what a peer waits for first).
  rv.wait_every_rank = [store](const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                               const std::string& what, const std::string& why) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(100);
    for (;;) {
      {
        pybind11::gil_scoped_acquire gil;
        if (store->check(keys)) return;
        if (std::chrono::steady_clock::now() >= deadline) {
          // The error that names the ranks missing (the Store's own error if the Store failed).
          wait_for_every_rank(*store, keys, std::chrono::milliseconds(1), what, why);
          return;
        }
      }
      {
        ReleaseGilIfHeld released;  // a caller that held it lets the others run meanwhile
        std::this_thread::sleep_for(pause);
      }
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
    }
  };
  return rv;
}

}  // namespace pycoll

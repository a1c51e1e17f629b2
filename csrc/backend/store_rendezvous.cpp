#include "backend/store_rendezvous.h"

#include <pybind11/pybind11.h>

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
  rv.wait_every_rank = [store](const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                               const std::string& what, const std::string& why) {
    pybind11::gil_scoped_acquire gil;
    wait_for_every_rank(*store, keys, timeout, what, why);
  };
  return rv;
}

}  // namespace pycoll

#include "bindings/allocator_bindings.h"

#include <pybind11/stl.h>
#include <torch/python.h>

#include "engines/shared_cpu_allocator.h"
#include "engines/shared_storage_ref.h"

namespace py = pybind11;

namespace pycoll {

void register_shared_cpu_allocator(py::module_& m) {
  m.def("install_shared_cpu_allocator", &install_shared_cpu_allocator, py::arg("min_bytes") = 0);
  m.def("uninstall_shared_cpu_allocator", &uninstall_shared_cpu_allocator);
  m.def("shared_cpu_allocator_installed", &shared_cpu_allocator_installed);
  m.def("apply_cpu_allocator_setting", &apply_cpu_allocator_setting);
  m.def("release_cached_shared_blocks", &release_cached_shared_blocks);
  m.def("shared_cpu_allocator_stats", []() {
    const SharedCpuAllocatorStats s = shared_cpu_allocator_stats();
    py::dict d;
    d["min_bytes"] = s.min_bytes;
    d["live_blocks"] = s.live_blocks;
    d["live_bytes"] = s.live_bytes;
    d["cached_blocks"] = s.cached_blocks;
    d["cached_bytes"] = s.cached_bytes;
    d["made"] = s.made;
    d["reused"] = s.reused;
    d["fallbacks"] = s.fallbacks;
    d["file_budget"] = s.file_budget;
    return d;
  });
  // Whether t's bytes live in a shared-memory file its peers can map (what the CPU engine checks
  // before reading in place): tests and the benchmark say which tensors are.
  m.def("_is_peer_mappable", [](const at::Tensor& t) { return shared_storage_of(t).valid(); });
}

}  // namespace pycoll

// pycollectives._C's shared CPU allocator functions (engines/shared_cpu_allocator.h); the Python
// API over them is pycollectives/memory.py.
#pragma once

#include <pybind11/pybind11.h>

namespace pycoll {

void register_shared_cpu_allocator(pybind11::module_& m);

}  // namespace pycoll

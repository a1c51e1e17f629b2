// pycollectives._C.cuda_workspace_layout: the CUDA IPC workspace layout (transport/cuda_ipc/
// layout.h) as plain numbers, so that CPU-only tests can check its arithmetic.
#pragma once

#include <pybind11/pybind11.h>

namespace pycoll {

void register_layout(pybind11::module_& m);

}  // namespace pycoll

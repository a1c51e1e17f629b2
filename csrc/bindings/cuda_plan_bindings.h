// pycollectives._C.cuda_all_reduce_plan and cuda_engine_limits: the CUDA engine's all_reduce plan
// (cuda/all_reduce_plan.h) for a size, world and SM count, so that CPU-only tests check it directly.
#pragma once

#include <pybind11/pybind11.h>

namespace pycoll {

void register_cuda_plan(pybind11::module_& m);

}  // namespace pycoll

// pycollectives._C.cpu_plan and cpu_may_ever_read_in_place: the CPU engine's plan (cpu/plan.h)
// for an op's facts, called directly, so that tests check every rule without ranks.
#pragma once

#include <pybind11/pybind11.h>

namespace pycoll {

void register_cpu_plan(pybind11::module_& m);

}  // namespace pycoll

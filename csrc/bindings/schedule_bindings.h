// pycollectives._C.set_schedule_source and friends: how the package hands schedule programs to the
// CPU engine (cpu/schedule_program.h; pycollectives/schedule/engine_tables.py builds the tables).
#pragma once

#include <pybind11/pybind11.h>

namespace pycoll {

void register_schedules(pybind11::module_& m);

}  // namespace pycoll

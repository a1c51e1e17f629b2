// pycollectives._C.flight_recorder_*: dumps of the flight recorder (backend/flight_recorder.h) on
// demand, its settings, and a micro-benchmark of its record path.
#pragma once

#include <pybind11/pybind11.h>

namespace pycoll {

void register_flight_recorder(pybind11::module_& m);

}  // namespace pycoll

// pycollectives._C's calls for the calibrated form across hosts (engines/host_form_model.h).
#pragma once

#include <pybind11/pybind11.h>

namespace pycoll {

void register_host_forms(pybind11::module_& m);

}  // namespace pycoll

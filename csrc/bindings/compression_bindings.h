// Python bindings of the gradient-compression kernels (pack_signs,
// unpack_signs, majority_vote, batched_orthogonalize_, flatten_into,
// unflatten_from) on the module pycollectives._C. module.cpp calls
// register_compression(m) once.
#pragma once

#include <pybind11/pybind11.h>

void register_compression(pybind11::module& m);

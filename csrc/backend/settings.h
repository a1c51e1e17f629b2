// Process-wide settings the Python package can change at run time.
#pragma once

#include "common/types.h"

namespace pycoll {

// PYCOLL_ALGO at start-up, or what pycollectives.set_algo() set last.
// Every rank must use the same value (the op header check catches it).
Algo algo_override();
void set_algo_override(Algo a);

}  // namespace pycoll

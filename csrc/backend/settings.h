// Process-wide settings the Python package can change at run time.
#pragma once

#include <string>

#include "common/types.h"

namespace pycoll {

// PYCOLL_ALGO at start-up, or what pycollectives.set_algo() set last.
// Every rank must use the same value (the op header check catches it).
Algo algo_override();
// The schedule program's name where algo_override() is Algo::Schedule, else "".
std::string schedule_override();
// A built-in algorithm's name (forcible_algorithm_names()) or, any other name without spaces, a
// schedule program's (registered, a shipped example, or "module:function"; the package checks
// that it resolves before it calls this). Throws std::invalid_argument for an empty or spaced name.
void set_algo_override(const std::string& name);

}  // namespace pycoll

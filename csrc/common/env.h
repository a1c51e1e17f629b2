// The debug log switch (PYCOLL_DEBUG, declared in env.cpp with the other settings: common/setting.h).
#pragma once

#include <cstdint>
#include <string>

namespace pycoll {

// PYCOLL_DEBUG=INFO logs one line per op (algorithm, bytes, time) to stderr.
bool debug_info_enabled();

}  // namespace pycoll

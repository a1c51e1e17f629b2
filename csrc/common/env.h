// Environment settings, read once where they are used. Each getter documents
// its variable; defaults are chosen for one host with 2-8 ranks.
#pragma once

#include <cstdint>
#include <string>

namespace pycoll {

std::string env_string(const char* name, const std::string& fallback);
int64_t env_int(const char* name, int64_t fallback);

// PYCOLL_DEBUG=INFO logs one line per op (algorithm, bytes, time) to stderr.
bool debug_info_enabled();

}  // namespace pycoll

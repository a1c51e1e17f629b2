#include "common/env.h"

#include <cstdlib>
#include <strings.h>

namespace pycoll {

std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (end == v) return fallback;
  // Accept K/M/G suffixes for byte sizes.
  if (*end == 'k' || *end == 'K') x <<= 10;
  if (*end == 'm' || *end == 'M') x <<= 20;
  if (*end == 'g' || *end == 'G') x <<= 30;
  return x;
}

bool debug_info_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("PYCOLL_DEBUG");
    return v && (strcasecmp(v, "INFO") == 0 || strcasecmp(v, "DEBUG") == 0 || strcasecmp(v, "TRACE") == 0);
  }();
  return on;
}

}  // namespace pycoll

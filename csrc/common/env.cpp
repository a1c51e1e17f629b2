#include "common/env.h"

#include "common/setting.h"

#include <cstdlib>
#include <strings.h>

namespace pycoll {

namespace {
const TextSetting kDebug("PYCOLL_DEBUG", "", "INFO (or DEBUG, TRACE)", "backend", false, Audience::User,
                         "INFO: one line per op on stderr (op, algorithm, bytes, time, and the plan that ran where "
                         "an engine has one: e.g. plan=twoshot ll128 grid=128), and which calibration auto uses.");
}  // namespace

bool debug_info_enabled() {
  static const bool on = [] {
    const std::string v = kDebug.get();
    const char* c = v.c_str();
    return strcasecmp(c, "INFO") == 0 || strcasecmp(c, "DEBUG") == 0 || strcasecmp(c, "TRACE") == 0;
  }();
  return on;
}

}  // namespace pycoll

#include "common/cpu_affinity.h"

#include <sched.h>

#include <algorithm>

namespace pycoll {

namespace {

bool allowed_cpus(cpu_set_t* set) {
  CPU_ZERO(set);
  return sched_getaffinity(0, sizeof(*set), set) == 0;
}

}  // namespace

int allowed_cpu_count() {
  cpu_set_t set;
  return allowed_cpus(&set) ? std::max(1, CPU_COUNT(&set)) : 1;
}

int first_allowed_cpu() {
  cpu_set_t set;
  if (!allowed_cpus(&set)) return 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) return cpu;
  }
  return 0;
}

}  // namespace pycoll

// The CPUs this process may run on (sched_getaffinity), which the CPU engine sizes its threads
// and its streaming stores' threshold by: not the host's CPU count, which a cgroup or taskset
// may restrict.
#pragma once

namespace pycoll {

// How many CPUs; 1 when the affinity cannot be read.
int allowed_cpu_count();

// The lowest-numbered one; 0 when the affinity cannot be read.
int first_allowed_cpu();

}  // namespace pycoll

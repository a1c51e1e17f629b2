// A micro-benchmark of the flight recorder's record path on CUDA tensors, as CudaOps::launch
// takes it for a synchronous collective (the costlier case: an asynchronous op reuses its Work's
// end event, so it records one event less): the entry, one pooled event recorded on the current
// stream before the op's kernels and one after, both handed to a watcher thread, which marks the
// op started and completed from them. Built only with CUDA (setup.py).
#pragma once

#include <cstdint>

namespace pycoll {

struct FlightRecorderCudaCost {
  double record_ns = 0;  // per op, the caller's host time of the whole record path
  double events_ns = 0;  // per op, the same two events taken from the pool and recorded, alone
};

// Runs `ops` ops of a group named "flight_recorder_cuda_bench" back to back on `device`'s current
// stream, no kernels between the events; every op is completed (by the watcher) once it returns.
FlightRecorderCudaCost flight_recorder_cuda_bench(int64_t ops, int device);

}  // namespace pycoll

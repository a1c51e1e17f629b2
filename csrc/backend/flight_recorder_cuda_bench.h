// A micro-benchmark of the flight recorder's record path on CUDA tensors, as CudaOps::launch
// takes it: the entry, pooled events recorded on the stream around the op's kernels, handed to a
// watcher thread, which marks the op started and completed from them. A synchronous op records
// two events for the recorder; an asynchronous one none: the event its comm stream waits for and
// its Work's end event serve (unless GPU durations are asked for). Built only with CUDA (setup.py).
#pragma once

#include <cstdint>

namespace pycoll {

struct FlightRecorderCudaCost {
  double sync_ns = 0;       // per op, the caller's host time of a synchronous op's record path
  double async_ns = 0;      // per op, what the record path adds to an asynchronous op (its own events not counted)
  double unwatched_ns = 0;  // per op, the synchronous path with the op completed at once, no watcher thread
  double events_ns = 0;     // per op, two events taken from the pool and recorded, alone
  double capture_ns = 0;    // per op, the stream-capture check made before an op is watched, alone
};

// Runs `ops` ops of a group named "flight_recorder_cuda_bench" back to back on `device`'s current
// stream, no kernels between the events, once per path; every op is completed once it returns.
FlightRecorderCudaCost flight_recorder_cuda_bench(int64_t ops, int device);

}  // namespace pycoll

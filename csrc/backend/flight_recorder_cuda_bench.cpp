#include "backend/flight_recorder_cuda_bench.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <string>
#include <vector>

#include "backend/cuda_event_pool.h"
#include "backend/cuda_op_watcher.h"
#include "backend/flight_recorder.h"

namespace pycoll {

namespace {

void check(cudaError_t err) { TORCH_CHECK(err == cudaSuccess, "flight_recorder_cuda_bench: ", cudaGetErrorString(err)); }

double ns_per_op(std::chrono::steady_clock::duration dt, int64_t ops) {
  return std::chrono::duration<double, std::nano>(dt).count() / static_cast<double>(ops);
}

}  // namespace

FlightRecorderCudaCost flight_recorder_cuda_bench(int64_t ops, int device) {
  TORCH_CHECK_VALUE(ops > 0, "flight_recorder_cuda_bench: ops must be positive, got ", ops);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  FlightRecorder& rec = FlightRecorder::get();
  const at::Tensor t = at::empty({1024}, at::TensorOptions().device(at::kCUDA, device));
  const std::string plan = "allreduce oneshot ctas=1";
  const int pg = rec.add_group("flight_recorder_cuda_bench", "bench", {0});
  // The pools CudaOps keeps (a timed one with PYCOLL_FR_GPU_TIMING), filled first with more events
  // than the watcher holds at once (it sweeps every millisecond), so that every get() reuses one,
  // as in a running job.
  EventPool pool(device, CudaOpWatcher::timing());
  {
    std::vector<EventPool::Event> fill;
    for (int i = 0; i < 8192; ++i) fill.push_back(pool.get());
  }
  const auto event_on = [&pool](cudaStream_t s) {
    EventPool::Event e = pool.get();
    check(cudaEventRecord(e.get(), s));
    return e;
  };

  const auto per_op = [ops](auto&& body) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 1; i <= ops; ++i) body(i);
    return ns_per_op(std::chrono::steady_clock::now() - t0, ops);
  };
  const auto entry = [&](int64_t i) {
    return rec.record(pg, i, i, 0, "all_reduce", -1, t, t, std::chrono::milliseconds(1000));
  };
  int64_t seq = 0;  // the group's sequence numbers go on across the paths

  // CudaOps::launch asks this before it watches an op (a captured stream's events cannot be queried).
  const auto not_capturing = [](cudaStream_t s) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(s, &capture));
    return capture == cudaStreamCaptureStatusNone;
  };

  FlightRecorderCudaCost cost;
  {
    CudaOpWatcher watcher([] { return std::string(); });
    cost.sync_ns = per_op([&](int64_t) {
      const FrHandle h = entry(++seq);
      TORCH_CHECK(not_capturing(stream));
      EventPool::Event before = event_on(stream);
      rec.ran(h, "cuda", "oneshot", plan);
      watcher.watch(h, device, stream, std::move(before), event_on(stream));
    });
    check(cudaStreamSynchronize(stream));
  }  // the watcher's last look completes every op
  cost.unwatched_ns = per_op([&](int64_t) {
    const FrHandle h = entry(++seq);
    EventPool::Event before = event_on(stream);
    rec.ran(h, "cuda", "oneshot", plan);
    EventPool::Event after = event_on(stream);
    rec.completed(h);
  });
  cost.events_ns = per_op([&](int64_t) {
    EventPool::Event before = event_on(stream);
    EventPool::Event after = event_on(stream);
  });
  cost.capture_ns = per_op([&](int64_t) { TORCH_CHECK(not_capturing(stream)); });
  // An asynchronous op hands the watcher the two events it records anyway (the one its comm stream
  // waits for, and its Work's end): the same path, less the events.
  cost.async_ns = cost.sync_ns - cost.events_ns;
  check(cudaStreamSynchronize(stream));
  return cost;
}

}  // namespace pycoll

#include "bindings/flight_recorder_bindings.h"

#include <ATen/ATen.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "backend/dump_watcher.h"
#include "backend/flight_recorder.h"
#ifdef PYCOLL_WITH_CUDA
#include "backend/flight_recorder_cuda_bench.h"
#endif

namespace py = pybind11;

namespace pycoll {

void register_flight_recorder(py::module_& m) {
  m.def(
      "flight_recorder_dump",
      [](const std::string& prefix, const std::string& reason) {
        return FlightRecorder::get().dump_to_file(prefix, reason);
      },
      py::arg("prefix") = "", py::arg("reason") = "on demand", py::call_guard<py::gil_scoped_release>(),
      "Writes this process's flight recorder to prefix + rank (prefix: TORCH_FR_DUMP_TEMP_FILE, else "
      "/tmp/pycoll_trace_rank_) and returns the path.");
  m.def(
      "flight_recorder_json", [](const std::string& reason) { return FlightRecorder::get().dump_json(reason); },
      py::arg("reason") = "on demand", py::call_guard<py::gil_scoped_release>(),
      "This process's flight recorder as the JSON text a dump holds.");
  m.def(
      "flight_recorder_capacity", []() { return FlightRecorder::get().capacity(); },
      "Entries the flight recorder keeps (0: off).");
  m.def(
      "flight_recorder_dumps_written", []() { return DumpWatcher::get().dumps_written(); },
      "Dumps the background thread wrote (on an error, a peer's request or a signal).");
  m.def(
      "flight_recorder_bench",
      [](int64_t ops, int64_t numel, int64_t threads, int64_t fail_every) {
        // The record path of one op as the runner takes it: record, started, ran, completed;
        // `threads` threads at once, each on its own group (the first named flight_recorder_bench, the others /1, /2...); every fail_every-th op fails.
        FlightRecorder& rec = FlightRecorder::get();
        const at::Tensor t = at::empty({numel});
        const std::string plan = "allreduce oneshot path=eager lanes=1";
        const auto body = [&rec, &t, &plan, ops, fail_every](int pg) {
          for (int64_t i = 1; i <= ops; ++i) {
            const FrHandle h = rec.record(pg, i, i, 0, "all_reduce", -1, t, t, std::chrono::milliseconds(1000));
            rec.started(h);
            rec.ran(h, "cpu", "oneshot", plan);
            const bool fail = fail_every > 0 && i % fail_every == 0;
            rec.completed(h, fail ? "bench failure" : nullptr);
          }
        };
        std::vector<int> groups;
        for (int64_t k = 0; k < std::max<int64_t>(threads, 1); ++k) {
          const std::string name = k == 0 ? "flight_recorder_bench" : "flight_recorder_bench/" + std::to_string(k);
          groups.push_back(rec.add_group(name, "bench", {0}));
        }
        const auto t0 = std::chrono::steady_clock::now();
        if (groups.size() == 1) {
          body(groups[0]);
        } else {
          std::vector<std::thread> running;
          for (const int pg : groups) running.emplace_back(body, pg);
          for (auto& th : running) th.join();
        }
        const auto dt = std::chrono::steady_clock::now() - t0;
        return std::chrono::duration<double, std::nano>(dt).count() / static_cast<double>(ops);
      },
      py::arg("ops") = 100000, py::arg("numel") = 1024, py::arg("threads") = 1, py::arg("fail_every") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "Nanoseconds per op (per thread) of the flight recorder's record path (record, started, ran, completed), "
      "run on `threads` threads at once, each on its own group (the first named flight_recorder_bench, the others /1, "
      "/2...); every fail_every-th op fails (0: none).");
#ifdef PYCOLL_WITH_CUDA
  m.def(
      "flight_recorder_cuda_bench",
      [](int64_t ops, int device) {
        FlightRecorderCudaCost c;
        {
          py::gil_scoped_release nogil;
          c = flight_recorder_cuda_bench(ops, device);
        }
        return py::dict(py::arg("sync_ns") = c.sync_ns, py::arg("async_ns") = c.async_ns,
                        py::arg("unwatched_ns") = c.unwatched_ns, py::arg("events_ns") = c.events_ns,
                        py::arg("capture_ns") = c.capture_ns);
      },
      py::arg("ops") = 20000, py::arg("device") = 0,
      "The record path on CUDA tensors, host ns per op: {'sync_ns': a synchronous op's (entry, two pooled events on "
      "the current stream, the watcher), 'async_ns': what it adds to an asynchronous op (no event: the op's own "
      "serve), 'unwatched_ns': the synchronous path completed at once without the watcher, 'events_ns': two events "
      "alone, 'capture_ns': the stream-capture check before an op is watched, alone}. Its ops belong to a group named flight_recorder_cuda_bench and are completed when it returns.");
#endif
}

}  // namespace pycoll

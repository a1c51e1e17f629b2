#include "bindings/cpu_plan_bindings.h"

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "common/types.h"
#include "cpu/kernels/stream_store.h"
#include "cpu/plan.h"

namespace py = pybind11;

namespace pycoll {

namespace {

// `what` among `values`, by the name `name_of` gives it; ValueError listing the names otherwise.
template <typename T, typename NameOf>
T by_name(const std::string& what, const char* kind, std::initializer_list<T> values, NameOf name_of) {
  std::string names;
  for (T v : values) {
    if (what == name_of(v)) return v;
    names += (names.empty() ? "" : ", ") + std::string(name_of(v));
  }
  throw py::value_error("cpu_plan: " + std::string(kind) + " '" + what + "' is not one of " + names);
}

// The names of CpuMemory, PeerRead and PeerReadProbe values, in the order of their values (cpu/plan.h).
constexpr const char* kMemoryNames[] = {"private", "shared", "shared everywhere"};
constexpr const char* kPeerReadNames[] = {"off", "auto", "on"};
constexpr const char* kProbeNames[] = {"not yet", "allowed", "denied"};
const char* peer_read_name(PeerRead m) { return kPeerReadNames[static_cast<int>(m)]; }

}  // namespace

void register_cpu_plan(py::module_& m) {
  m.def(
      "cpu_plan",
      [](const std::string& op, int64_t count, const std::string& dtype, int ranks, const std::string& algo,
         int threads, const std::string& memory, const std::string& peer_read, const std::string& probe,
         int64_t workspace_bytes, int64_t stream_min_bytes) {
        if (count < 0 || ranks < 1 || threads < 1 || workspace_bytes < 0)
          throw py::value_error("cpu_plan: count and workspace_bytes must be >= 0, ranks and threads >= 1");
        CpuOpFacts f;
        f.op = by_name(op, "op",
                       {OpCode::AllReduce, OpCode::Reduce, OpCode::Broadcast, OpCode::AllGather, OpCode::ReduceScatter},
                       op_name);
        f.count = count;
        f.dtype = by_name(dtype, "dtype",
                          {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16, DType::Int8, DType::UInt8,
                           DType::Int32, DType::Int64, DType::Bool, DType::Int16, DType::Float8E4M3, DType::Float8E5M2},
                          dtype_name);
        f.ranks = ranks;
        try {
          f.requested = parse_algo(algo);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
        f.threads = threads;
        f.memory = by_name(memory, "memory", {CpuMemory::Private, CpuMemory::Shared, CpuMemory::SharedEvery},
                           [](CpuMemory v) { return kMemoryNames[static_cast<int>(v)]; });
        f.peer_read = by_name(peer_read, "peer_read", {PeerRead::Off, PeerRead::Auto, PeerRead::On}, peer_read_name);
        f.probe = by_name(probe, "probe", {PeerReadProbe::NotYet, PeerReadProbe::Allowed, PeerReadProbe::Denied},
                          [](PeerReadProbe v) { return kProbeNames[static_cast<int>(v)]; });
        f.workspace_bytes = static_cast<size_t>(workspace_bytes);
        f.stream_min_bytes =
            stream_min_bytes >= 0 ? static_cast<size_t>(stream_min_bytes) : stream_store_min_bytes(ranks);
        const CpuPlan p = plan_cpu_op(f);
        py::dict d;
        d["bytes"] = static_cast<int64_t>(p.bytes);
        d["algorithm"] = algo_name(p.algo);
        d["path"] = cpu_path_name(p.path);
        d["lanes"] = p.lanes;
        d["root_writes"] = p.root_writes;
        d["stream_out"] = p.stream_out;
        d["probe_first"] = p.probe_first;
        d["describe"] = p.describe();
        return d;
      },
      py::arg("op"), py::arg("count"), py::arg("dtype") = "float32", py::arg("ranks") = 2, py::arg("algo") = "auto",
      py::arg("threads") = 1, py::arg("memory") = "private", py::arg("peer_read") = "off", py::arg("probe") = "not yet",
      py::arg("workspace_bytes") = int64_t(16) << 20, py::arg("stream_min_bytes") = -1,
      "The CPU engine's plan (csrc/cpu/plan.h) for `op` (allreduce, reduce, broadcast, allgather, reduce_scatter) of "
      "`count` elements (all_gather, reduce_scatter: one rank's block) on `ranks` ranks offering `threads` threads "
      "each; memory: private, shared (what the op reads of peers) or 'shared everywhere'; peer_read: the least "
      "PYCOLL_CPU_PEER_READ; probe: 'not yet', allowed or denied; stream_min_bytes -1: this machine's default. "
      "What the engine runs and logs, with the cost table as set now.");
  m.def(
      "cpu_may_ever_read_in_place",
      [](const std::string& peer_read, int ranks, int threads) {
        return may_ever_read_in_place(
            by_name(peer_read, "peer_read", {PeerRead::Off, PeerRead::Auto, PeerRead::On}, peer_read_name), ranks,
            threads);
      },
      py::arg("peer_read"), py::arg("ranks"), py::arg("threads"),
      "Whether a CPU rank with this PYCOLL_CPU_PEER_READ and threads may ever read its peers in place, at any size "
      "(only then does it name a tracer for them, csrc/common/ptracer.h).");
}

}  // namespace pycoll

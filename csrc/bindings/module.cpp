// The Python module pycollectives._C: the backend class, its factory, and the
// process-wide settings and counters.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/python.h>

#include "cpu/lane_pool.h"
#include "cpu/cost_table.h"
#include "bindings/schedule_bindings.h"
#include "bindings/allocator_bindings.h"
#include "bindings/compression_bindings.h"
#include "bindings/cpu_plan_bindings.h"
#include "bindings/cuda_plan_bindings.h"
#include "bindings/flight_recorder_bindings.h"
#include "bindings/host_form_bindings.h"
#include "bindings/layout_bindings.h"
#include "common/setting.h"
#include "common/cpu_affinity.h"
#include "common/ptracer.h"
#include "common/settings_agreement.h"
#include "common/store_wait.h"
#include "common/test_hooks.h"
#include "cpu/kernels/stream_store.h"
#include "cuda/measured_choices.h"
#include "cuda/engine_limits.h"
#include "cuda/select.h"
#include "backend/executor.h"
#include "backend/op_stats.h"
#include "backend/process_group.h"
#include "backend/settings.h"
#include "transport/cuda_ipc/layout.h"

namespace py = pybind11;

namespace {

bool built_with_cuda() {
#ifdef PYCOLL_WITH_CUDA
  return true;
#else
  return false;
#endif
}

pycoll::OpCode parse_op(const std::string& s) {
  using pycoll::OpCode;
  if (s == "all_reduce" || s == "allreduce") return OpCode::AllReduce;
  if (s == "all_gather" || s == "allgather") return OpCode::AllGather;
  if (s == "reduce_scatter") return OpCode::ReduceScatter;
  if (s == "broadcast") return OpCode::Broadcast;
  if (s == "reduce") return OpCode::Reduce;
  throw std::invalid_argument("unknown op for the cost model: '" + s +
                              "' (expected all_reduce, all_gather, reduce_scatter, broadcast or reduce)");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pycollectives native extension";
  // pybind11 must know c10d::Backend before the class below names it as its base.
  py::module::import("torch._C._distributed_c10d");
  py::class_<pycoll::ProcessGroupPycoll, c10d::Backend, c10::intrusive_ptr<pycoll::ProcessGroupPycoll>>(
      m, "ProcessGroupPycoll")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& group_name) {
             return c10::make_intrusive<pycoll::ProcessGroupPycoll>(store, rank, size, timeout, group_name);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name"),
           py::call_guard<py::gil_scoped_release>())
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& group_name, const std::string& host_id,
                       int host_index, int num_hosts, const std::vector<int>& host_ranks,
                       const std::vector<int>& host_of, bool uniform,
                       const std::optional<c10::intrusive_ptr<c10d::Backend>>& rail,
                       const c10::intrusive_ptr<c10d::Backend>& flat,
                       const std::optional<c10::intrusive_ptr<c10d::Backend>>& device_rail,
                       const std::optional<c10::intrusive_ptr<c10d::Backend>>& device_flat, int64_t link_bps) {
             pycoll::HostLayout h;
             h.host_id = host_id;
             h.host_index = host_index;
             h.num_hosts = num_hosts;
             h.host_ranks = host_ranks;
             h.host_of = host_of;
             h.uniform = uniform;
             if (rail) h.rail = *rail;
             h.flat = flat;
             if (device_rail) h.device_rail = *device_rail;
             if (device_flat) h.device_flat = *device_flat;
             h.link_bps = link_bps;
             return c10::make_intrusive<pycoll::ProcessGroupPycoll>(store, rank, size, timeout, group_name,
                                                                    std::move(h));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name"),
           py::arg("host_id"), py::arg("host_index"), py::arg("num_hosts"), py::arg("host_ranks"), py::arg("host_of"),
           py::arg("uniform"), py::arg("rail"), py::arg("flat"), py::arg("device_rail") = py::none(),
           py::arg("device_flat") = py::none(), py::arg("link_bps") = 0, py::call_guard<py::gil_scoped_release>(),
           "A group across hosts (pycollectives/hosts.py): the CPU engine over host_ranks, the inter-host "
           "backends rail (this rank's local rank on every host; None unless uniform) and flat (every rank), "
           "and the same two for CUDA tensors (device_rail, device_flat: NCCL; None without CUDA); link_bps: the "
           "rate of the links between hosts (PYCOLL_LINK), 0 where not known.")
      .def(
          "perform_nocolor_split", [](pycoll::ProcessGroupPycoll&, const at::Device&) {},
          "Nothing to do: torch calls it on the ranks outside a new_group when the default group is bound "
          "to a device (init_process_group(device_id=)) and can split, for NCCL's collective ncclCommSplit; a "
          "pycoll group is made by its members only.")
      .def("_backend_options", &pycoll::ProcessGroupPycoll::getBackendOptions,
           "getBackendOptions(): the fields of the `options` property (pycollectives/split_options.py).")
      .def("_describe_for_recorder", &pycoll::ProcessGroupPycoll::describe_for_recorder, py::arg("desc"),
           py::arg("global_ranks"), "The group's description and global ranks, for the flight recorder's dumps.")
      .def("cuda_trace", &pycoll::ProcessGroupPycoll::cuda_trace, py::call_guard<py::gil_scoped_release>(),
           "Timeline of the last kernel traced with PYCOLL_CUDA_TRACE=1: rows of trace_events() "
           "%globaltimer stamps (ns), one per CTA (cuda/kernels/trace.cuh).");
  m.def("trace_events", []() { return pycoll::cuda_ipc::kTraceEvents; });

  m.def("built_with_cuda", &built_with_cuda, "True if the CUDA engine was compiled in");
  m.def(
      "_wait_for_background_work",
      [](double seconds) {
        return pycoll::wait_for_background_work(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
      },
      py::arg("seconds"), py::call_guard<py::gil_scoped_release>(),
      "Waits (at most `seconds`) until no engine thread or completion thread holds work; False if it "
      "gave up. Called at interpreter exit (backend/executor.h says why).");
  m.def(
      "set_algo", [](const std::string& name) { pycoll::set_algo_override(name); },
      "Force an algorithm for every later op of this process (ring, tree, oneshot, twoshot, auto)");
  m.def("algorithm_names", &pycoll::forcible_algorithm_names,
        "The algorithms PYCOLL_ALGO and set_algo accept, auto first (csrc/common/types.h)");
  m.def("get_algo", []() {
    const pycoll::Algo a = pycoll::algo_override();
    return a == pycoll::Algo::Schedule ? pycoll::schedule_override() : std::string(pycoll::algo_name(a));
  });
  m.def("stats", []() {
    py::dict d;
    for (const auto& [op, c] : pycoll::op_stats()) {
      py::dict e;
      e["calls"] = c.calls;
      e["bytes"] = c.bytes;
      d[py::str(op)] = e;
    }
    return d;
  });
  m.def("reset_stats", &pycoll::reset_op_stats);
  m.def(
      "settings",
      []() {
        py::list out;
        for (const auto& s : pycoll::registered_settings()) {
          py::dict d;
          d["name"] = s.name;
          d["default"] = s.default_text;
          d["range"] = s.range_text;
          d["doc"] = s.doc;
          d["scope"] = s.scope;
          d["ranks_agree"] = s.ranks_agree;
          d["audience"] = s.audience == pycoll::Audience::User ? "user" : "developer";
          out.append(d);
        }
        return out;
      },
      "Every PYCOLL_* setting the extension reads (common/setting.h), sorted by name.");
  m.def("read_setting", &pycoll::read_setting, py::arg("name"),
        "A setting's value now (the default when unset), parsed and range-checked; ValueError when bad.");
  m.def("settings_disagreement", &pycoll::settings_disagreement, py::arg("encoded_per_rank"),
        "Empty if every rank's 'name=value' lines agree, else one line per setting that differs "
        "(what the CUDA engine checks when it starts).");
  m.def("set_cost_entry", [](const std::string& op, const std::string& algo, double alpha_us, double beta_us_per_byte) {
    pycoll::set_cost_entry({parse_op(op), pycoll::parse_algo(algo), alpha_us, beta_us_per_byte});
  });
  m.def("cost_entries", []() {
    py::list out;
    for (const auto& e : pycoll::cost_entries()) {
      out.append(py::make_tuple(pycoll::op_name(e.op), pycoll::algo_name(e.algo), e.alpha_us, e.beta_us_per_byte));
    }
    return out;
  });
  m.def("select_algorithm", [](const std::string& op, size_t bytes, int world) {
    return std::string(pycoll::algo_name(pycoll::cheapest_algorithm(parse_op(op), bytes, world)));
  });
  m.def("cpu_threads_per_rank", &pycoll::cpu_threads_per_rank, py::arg("ranks_on_host"),
        "Threads per rank the CPU engine uses for large ops (csrc/cpu/lane_pool.h).");
  m.def("cpu_auto_threads_per_rank", &pycoll::auto_threads_per_rank, py::arg("cpus"), py::arg("ranks_on_host"),
        "Threads per rank the CPU engine uses when PYCOLL_CPU_THREADS is 0 (csrc/cpu/lane_pool.h).");
  // The CUDA engine's `auto` choice (pure C++, so CPU-only builds answer it too). `bytes`: the
  // tensor for all_reduce, one rank's share for all_gather and reduce_scatter.
  m.def("cuda_two_shot_max_blocks", &pycoll::gpu::two_shot_max_blocks, py::arg("bytes"), py::arg("world"),
        py::arg("waves"), py::arg("max_blocks"), py::arg("wide_blocks"),
        "CTAs a two-shot all_reduce of `bytes` may use on the CUDA engine (csrc/cuda/select.h).");
  m.def("cuda_two_shot_chunk_bytes", &pycoll::gpu::two_shot_chunk_bytes, py::arg("bytes"), py::arg("seg_bytes"),
        py::arg("world"), py::arg("waves"), py::arg("wide_blocks"), py::arg("chunk_bytes"), py::arg("chunk_set"),
        "Chunk cap of a two-shot all_reduce of `bytes` on the CUDA engine (csrc/cuda/select.h).");
  m.def(
      "cuda_algorithm",
      [](const std::string& op, int64_t bytes, int world, bool builtin, int64_t fast_two_shot_max_bytes) {
        const pycoll::OpCode o = parse_op(op);
        if (o != pycoll::OpCode::AllReduce && o != pycoll::OpCode::ReduceScatter && o != pycoll::OpCode::AllGather)
          throw py::value_error("cuda_algorithm: op must be all_reduce, all_gather or reduce_scatter, got " + op);
        if (builtin) return std::string(pycoll::algo_name(pycoll::gpu::builtin_choice(o, bytes, world)));
        if (o != pycoll::OpCode::AllReduce) return std::string(pycoll::algo_name(pycoll::gpu::choose(o, bytes, world)));
        const int64_t fast = fast_two_shot_max_bytes >= 0
                                 ? fast_two_shot_max_bytes
                                 : pycoll::gpu::limited_protocol_max_bytes(pycoll::gpu::read_engine_limits(world, 132),
                                                                           pycoll::Algo::TwoShot);
        return std::string(pycoll::algo_name(pycoll::gpu::choose_all_reduce(bytes, world, fast)));
      },
      py::arg("op"), py::arg("bytes"), py::arg("world"), py::arg("builtin") = false,
      py::arg("fast_two_shot_max_bytes") = -1,
      "The CUDA engine's `auto` choice; builtin=True: without this machine's measured table; "
      "fast_two_shot_max_bytes: the largest all_reduce a registered two-shot protocol (LL128) runs "
      "(-1: the engine's, from its settings now).");
  m.def(
      "set_cuda_choices",
      [](const std::string& op, int world, const std::vector<std::pair<int64_t, std::string>>& steps,
         int64_t max_bytes) {
        std::vector<pycoll::gpu::MeasuredStep> v;
        for (const auto& [from, algo] : steps) v.push_back({from, pycoll::parse_algo(algo)});
        try {
          pycoll::gpu::set_measured_steps(parse_op(op), world, v, max_bytes);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("op"), py::arg("world"), py::arg("steps"), py::arg("max_bytes"),
      "Install the CUDA engine's measured `auto` choices for (op, world size): [(from_bytes, algo)], "
      "bytes as cuda_algorithm counts them (csrc/cuda/measured_choices.h).");
  m.def("clear_cuda_choices", &pycoll::gpu::clear_measured_steps, "Back to the built-in CUDA choices.");
  m.def("cuda_choices_digest", &pycoll::gpu::measured_steps_digest, py::arg("world"),
        "The installed measured CUDA choices for `world` ranks, one entry per op ('' when none): "
        "what the ranks of a group compare when its CUDA engine starts.");
  m.def(
      "_set_test_thread_linger_ms",
      [](int64_t ms) { pycoll::test_hooks::set_thread_linger(std::chrono::milliseconds(ms)); }, py::arg("ms"),
      "Tests only: backend threads keep each finished task this long before dropping it (common/test_hooks.h).");
  m.def(
      "_set_test_deny_peer_read", [](bool deny) { pycoll::test_hooks::set_deny_peer_read(deny); }, py::arg("deny"),
      "Tests only: this process's cross-memory attach reads fail as if the OS forbade them (common/test_hooks.h).");
  m.def(
      "_set_test_deny_shared_open", [](bool deny) { pycoll::test_hooks::set_deny_shared_open(deny); }, py::arg("deny"),
      "Tests only: opening peers' shared-memory files fails as if the OS forbade it (common/test_hooks.h).");
  m.def(
      "_test_wait_for_every_rank",
      [](const c10::intrusive_ptr<c10d::Store>& store, const std::vector<std::string>& keys, int64_t timeout_ms) {
        py::gil_scoped_release nogil;
        pycoll::wait_for_every_rank(*store, keys, std::chrono::milliseconds(timeout_ms), "pycoll: test wait",
                                    "(the reason)");
      },
      py::arg("store"), py::arg("keys"), py::arg("timeout_ms"),
      "Tests only: the wait for one Store key per rank (common/store_wait.h).");
  m.def("_test_shared_votes", &pycoll::test_hooks::shared_votes,
        "Tests only: how many times this process voted on mapping peers' shared files (common/test_hooks.h).");
  m.def("_test_p2p_into_receiver", &pycoll::test_hooks::p2p_into_receiver,
        "Tests only: how many point-to-point messages this process wrote straight into their receiver's shared "
        "buffer (cpu/p2p.h).");
  m.def("_test_p2p_by_reference", &pycoll::test_hooks::p2p_by_reference,
        "Tests only: how many point-to-point messages this process received by reference (common/test_hooks.h).");
  m.def("_test_streamed_bytes", &pycoll::test_hooks::streamed_bytes,
        "Tests only: how many bytes this process wrote with streaming stores (cpu/kernels/stream_store.h).");
  m.def(
      "_test_stream_store_min_bytes",
      [](int ranks) { return static_cast<int64_t>(pycoll::stream_store_min_bytes(ranks)); }, py::arg("ranks"),
      "Tests only: the streaming stores' threshold for this many ranks on a host (cpu/kernels/stream_store.h).");
  m.def("_test_nearest_common_ancestor", &pycoll::nearest_common_ancestor, py::arg("pids"),
        "Tests only: the nearest process that is an ancestor of, or one of, every pid; 0 if none (common/ptracer.h).");
  m.def(
      "_test_choose_ptracer",
      [](const std::vector<int64_t>& pids, int scope) {
        const pycoll::PtracerDeclaration d = pycoll::choose_ptracer(pids, scope);
        return py::make_tuple(d.tracer, d.what);
      },
      py::arg("pids"), py::arg("scope"),
      "Tests only: (tracer, message) that a CPU engine would name for these ranks' pids under Yama ptrace_scope "
      "`scope`, without naming it (common/ptracer.h).");
  m.def("_yama_ptrace_scope", &pycoll::yama_ptrace_scope,
        "Yama's ptrace_scope on this host, or -1 where Yama is not loaded (common/ptracer.h).");
  m.def("_test_cache_cpu", &pycoll::first_allowed_cpu,
        "Tests only: the CPU whose cache sizes the streaming stores' threshold (common/cpu_affinity.h).");
  m.def(
      "_test_stream_copy",
      [](at::Tensor dst, const at::Tensor& src) {
        TORCH_CHECK(dst.device().is_cpu() && src.device().is_cpu(), "_test_stream_copy: CPU tensors only");
        TORCH_CHECK(dst.is_contiguous() && src.is_contiguous(), "_test_stream_copy: contiguous tensors only");
        TORCH_CHECK(dst.nbytes() == src.nbytes(), "_test_stream_copy: ", src.nbytes(), " bytes into ", dst.nbytes());
        pycoll::stream_copy(dst.data_ptr(), src.data_ptr(), src.nbytes());
      },
      py::arg("dst"), py::arg("src"),
      "Tests only: stream_copy(dst, src) over the tensors' bytes (cpu/kernels/stream_store.h).");
  register_compression(m);
  pycoll::register_layout(m);
  pycoll::register_cuda_plan(m);
  pycoll::register_flight_recorder(m);
  pycoll::register_cpu_plan(m);
  pycoll::register_schedules(m);
  pycoll::register_host_forms(m);
  pycoll::register_shared_cpu_allocator(m);
}

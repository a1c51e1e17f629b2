#include "bindings/cuda_plan_bindings.h"

#include <pybind11/stl.h>

#include <stdexcept>
#include <string>
#include <tuple>

#include "cuda/all_reduce_plan.h"
#include "cuda/all_reduce_registry.h"
#include "cuda/engine_limits.h"
#include "cuda/select.h"
#include "cuda/kernels/all_to_all_role.h"
#include "cuda/kernels/args.h"
#include "transport/cuda_ipc/layout.h"
#include "transport/cuda_ipc/check_word.h"

namespace py = pybind11;

namespace pycoll {

namespace {

py::dict limits_dict(const gpu::EngineLimits& l) {
  py::dict d;
  d["nranks"] = l.nranks;
  d["sms"] = l.sms;
  d["max_blocks"] = l.max_blocks;
  d["small_max_blocks"] = l.small_max_blocks;
  d["workspace_blocks"] = l.workspace_blocks;
  d["slot_bytes"] = l.slot_bytes;
  d["chunk_bytes"] = l.chunk_bytes;
  d["split_min_bytes"] = l.split_min_bytes;
  d["split_chunk_bytes"] = l.split_chunk_bytes;
  d["claimed_chunk_bytes"] = l.claimed_chunk_bytes;
  d["two_shot_waves"] = l.two_shot_waves;
  d["two_shot_wide_blocks"] = l.two_shot_wide_blocks;
  py::dict protocols;  // the registered protocols' limits, by name
  const auto& registered = gpu::all_reduce_protocols();
  for (size_t i = 0; i < registered.size(); ++i) {
    py::dict p;
    p["max_bytes"] = l.protocols.at(i).max_bytes;
    p["max_blocks"] = l.protocols.at(i).max_blocks;
    protocols[registered[i].name] = p;
  }
  d["protocols"] = protocols;
  return d;
}

}  // namespace

void register_cuda_plan(py::module_& m) {
  m.def(
      "cuda_engine_limits", [](int world, int sms) { return limits_dict(gpu::read_engine_limits(world, sms)); },
      py::arg("world"), py::arg("sms") = 132,
      "What the CUDA engine's settings allow for `world` ranks on a GPU of `sms` SMs (cuda/engine_limits.h), "
      "read from the PYCOLL_CUDA_* variables now.");
  m.def(
      "cuda_all_reduce_protocols",
      []() {
        py::list out;
        const auto& registered = gpu::all_reduce_protocols();
        for (size_t i = 0; i < registered.size(); ++i) {
          py::dict d;
          d["name"] = registered[i].name;
          py::list algos;
          for (Algo a : {Algo::OneShot, Algo::TwoShot, Algo::Ring, Algo::Tree})
            if (registered[i].runs(a)) algos.append(algo_name(a));
          d["algorithms"] = algos;
          d["check_code"] = registered[i].check_code;  // 0: its plan sets a built-in one
          d["check_plan"] = registered[i].check_code ? cuda_ipc::check_plan_name(registered[i].check_code) : "";
          d["has_region"] = registered[i].has_region();
          d["priority"] = registered[i].priority;
          d["has_kernel"] = gpu::all_reduce_launcher(int(i)) != nullptr;  // false in CPU-only builds
          out.append(d);
        }
        return out;
      },
      "The all_reduce protocols registered with the CUDA engine (cuda/all_reduce_registry.h), in the order "
      "the plan tries them.");
  m.def(
      "cuda_all_reduce_plan",
      [](int64_t count, int64_t elem_bytes, int world, const std::string& algo, int sms) {
        if (count < 0 || (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8))
          throw py::value_error("cuda_all_reduce_plan: count must be >= 0 and elem_bytes 1, 2, 4 or 8");
        const gpu::EngineLimits l = gpu::read_engine_limits(world, sms);
        gpu::AllReducePlan p;
        try {
          p = gpu::plan_all_reduce(count, elem_bytes, parse_algo(algo), l);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
        py::dict d;
        d["algorithm"] = algo_name(p.algo);
        d["protocol"] = p.protocol_name();
        d["variant"] = p.variant;
        d["check_plan"] = cuda_ipc::check_plan_name(int(p.check));
        d["mode"] = int(p.mode);
        d["flags"] = p.flags;
        d["grid"] = p.grid;
        d["chunk"] = p.chunk;
        d["nchunks"] = p.nchunks;
        d["seg"] = p.seg;
        d["early_ok"] = p.early_ok;
        d["describe"] = p.describe();
        if (p.protocol >= 0) {
          // What the engine checks before it launches: the plan within the workspace its limits give.
          d["fits"] = gpu::all_reduce_protocols()[size_t(p.protocol)].fits(p, count, elem_bytes, world, p.protocol,
                                                                           gpu::workspace_layout(l));
        }
        return d;
      },
      py::arg("count"), py::arg("elem_bytes"), py::arg("world"), py::arg("algo") = "auto", py::arg("sms") = 132,
      "The CUDA engine's plan for an all_reduce of `count` elements of `elem_bytes` each on `world` ranks "
      "(cuda/all_reduce_plan.h), with the PYCOLL_CUDA_* settings as set now; what the engine launches and logs.");
  m.def(
      "cuda_p2p_plan",
      [](int64_t bytes, int world, int sms) {
        if (bytes < 0 || world < 2 || world > cuda_ipc::kMaxRanks || sms < 1)
          throw py::value_error("cuda_p2p_plan: bytes must be >= 0, world 2..8 and sms >= 1");
        const cuda_ipc::Layout L = cuda_ipc::make_layout(world);
        const gpu::Geometry g = gpu::plan_p2p(bytes, L.p2p.slot_bytes, L.p2p.nblocks, sms);
        py::dict d;
        d["blocks"] = g.blocks;
        d["chunk"] = g.chunk;
        d["nchunks"] = g.nchunks;
        d["slot_bytes"] = L.p2p.slot_bytes;
        d["slots"] = L.p2p.nslots;
        d["channels"] = L.p2p.nblocks;
        d["gated"] = gpu::p2p_receive_gated(g);
        return d;
      },
      py::arg("bytes"), py::arg("world"), py::arg("sms") = 132,
      "How the CUDA engine cuts a send/recv of `bytes` on a group of `world` ranks (gpu::plan_p2p): "
      "CTAs, chunk, chunks, the p2p channel set's slot size, depth and channel count, and whether a receive of it "
      "waits for its first chunk on one CTA first (gated).");
  m.def(
      "cuda_p2p_batch_plan",
      [](const std::vector<std::tuple<int, bool, int64_t>>& ops, int world, int sms) {
        if (world < 2 || world > cuda_ipc::kMaxRanks || sms < 1)
          throw py::value_error("cuda_p2p_batch_plan: world 2..8 and sms >= 1");
        const cuda_ipc::Layout L = cuda_ipc::make_layout(world);
        std::vector<gpu::P2PBatchItem> items;
        for (const auto& [peer, is_send, bytes] : ops) {
          if (peer < 0 || peer >= world || bytes < 0)
            throw py::value_error("cuda_p2p_batch_plan: each op is (peer in 0..world-1, is_send, bytes >= 0)");
          items.push_back({peer, is_send, bytes});
        }
        const gpu::P2PBatchPlan p =
            gpu::plan_p2p_batch(items, kernels::kMaxP2PBatchOps, L.p2p.slot_bytes, L.p2p.nblocks, sms);
        py::list per_op;
        for (size_t i = 0; i < items.size(); ++i) {
          py::dict d;
          d["blocks"] = p.geometry[i].blocks;
          d["chunk"] = p.geometry[i].chunk;
          d["nchunks"] = p.geometry[i].nchunks;
          d["first_block"] = p.first_block[i];
          per_op.append(d);
        }
        py::dict d;
        d["fits"] = p.fits;
        d["grid"] = p.grid;
        d["ops"] = per_op;
        return d;
      },
      py::arg("ops"), py::arg("world"), py::arg("sms") = 132,
      "How the CUDA engine launches a coalesced batch of sends and receives (gpu::plan_p2p_batch): whether it "
      "fits one launch, its CTAs, and per op (peer, is_send, bytes) plan_p2p's cut and first CTA.");
  m.def(
      "cuda_all_to_all_roles",
      [](int world, int rank, int coll_channels, int sms) {
        if (world < 1 || world > cuda_ipc::kMaxRanks || rank < 0 || rank >= world || coll_channels < world || sms < 1)
          throw py::value_error(
              "cuda_all_to_all_roles: world 1..8, rank in 0..world-1, coll_channels >= world, sms >= 1");
        const int grid = 2 * gpu::all_to_all_channels(world, coll_channels, sms);
        py::list roles;
        for (int b = 0; b < grid; ++b) {
          const kernels::AllToAllRole r = kernels::all_to_all_role(world, rank, grid, b);
          roles.append(py::make_tuple(r.peer, r.chan, r.channels, r.sender));
        }
        return roles;
      },
      py::arg("world"), py::arg("rank"), py::arg("coll_channels") = int(cuda_ipc::kCollBlocks), py::arg("sms") = 132,
      "The all_to_all's CTAs on `rank` (cuda/kernels/all_to_all_role.h): per CTA (peer or -1, channel, channels per "
      "pair, sender).");
}

}  // namespace pycoll

#include "bindings/layout_bindings.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuda/all_reduce_registry.h"
#include "cuda/engine_limits.h"
#include "transport/cuda_ipc/check_word.h"
#include "transport/cuda_ipc/layout.h"

namespace py = pybind11;

namespace pycoll {

namespace {

using cuda_ipc::ChannelSetLayout;
using cuda_ipc::Layout;
using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // [begin, end) byte ranges

// Every byte range of rank `me`'s workspace that the offset functions of one channel set produce
// (the set's own regions only; which rank writes each range does not matter here).
void channel_ranges(const ChannelSetLayout& c, int n, int me, const std::string& set,
                    std::map<std::string, Ranges>* out) {
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    for (int b = 0; b < c.nblocks; ++b) {
      const int64_t t = c.tail_offset(q, b);  // written by q into me
      (*out)[set + ".tail"].push_back({t, t + 8});
      const int64_t h = c.head_offset(q, b);  // written by q (a receiver of me) into me
      (*out)[set + ".head"].push_back({h, h + 8});
      const int64_t sn = c.sent_offset(b, q);
      (*out)[set + ".sent"].push_back({sn, sn + 8});
      const int64_t rv = c.recvd_offset(b, q);
      (*out)[set + ".recvd"].push_back({rv, rv + 8});
      for (int s = 0; s < c.nslots; ++s) {
        const int64_t k = c.check_offset(q, b, s);
        (*out)[set + ".check"].push_back({k, k + 8});
        const int64_t d = c.slot_offset(n, q, me, b, s);
        (*out)[set + ".data"].push_back({d, d + c.slot_bytes});
      }
    }
  }
}

py::dict layout_report(int nranks, int me, int64_t coll_slot_bytes, int coll_blocks,
                       const std::map<std::string, int64_t>& protocols) {
  if (nranks < 2 || nranks > cuda_ipc::kMaxRanks) throw py::value_error("nranks must be in 2..8");
  if (me < 0 || me >= nranks) throw py::value_error("rank must be in 0..nranks-1");
  if (coll_blocks < cuda_ipc::kCollBlocks || coll_blocks > cuda_ipc::kMaxCollBlocks)
    throw py::value_error("coll_blocks must be in 64..128");
  // The registered protocols' regions, each with the limit given (0 when not given: no region).
  gpu::EngineLimits limits;
  limits.nranks = nranks;
  const auto& registered = gpu::all_reduce_protocols();
  for (const auto& r : registered) {
    gpu::ProtocolLimits pl = r.read_limits(nranks, 132);  // its settings now; only the limit given here
    const auto it = protocols.find(r.name);
    pl.max_bytes = it == protocols.end() ? 0 : it->second;
    if (pl.max_bytes < 0) throw py::value_error(std::string("the ") + r.name + " limit must be >= 0");
    limits.protocols.push_back(pl);
  }
  for (const auto& kv : protocols)
    if (gpu::find_all_reduce_protocol(kv.first) < 0)
      throw py::value_error("no all_reduce protocol named '" + kv.first + "' is registered");
  const std::vector<cuda_ipc::ProtocolRegion> regions = gpu::protocol_regions(limits);
  const Layout L = cuda_ipc::make_layout(nranks, coll_slot_bytes, coll_blocks, regions.data(), int(regions.size()));
  std::map<std::string, Ranges> ranges;
  ranges["abort"].push_back({L.off_abort, L.off_abort + 4});
  ranges["claim"].push_back({L.off_claim, L.off_claim + 4});
  channel_ranges(L.coll, nranks, me, "coll", &ranges);
  channel_ranges(L.p2p, nranks, me, "p2p", &ranges);
  for (int b = 0; b < L.ll.nblocks; ++b) {
    const int64_t e = L.ll.epoch_offset(b);
    ranges["ll.epoch"].push_back({e, e + 8});
  }
  for (int parity = 0; parity < 2; ++parity) {
    for (int q = 0; q < nranks; ++q) {
      if (q == me) continue;
      for (int b = 0; b < L.ll.nblocks; ++b) {  // one range per CTA region: header + payload lines
        const int64_t first = L.ll.line_offset(nranks, q, me, parity, b, 0);
        const int64_t last = L.ll.line_offset(nranks, q, me, parity, b, L.ll.block_lines - 1);
        ranges["ll.data"].push_back({first, last + cuda_ipc::kLLLineBytes});
      }
    }
  }
  py::dict region_sizes;
  std::vector<std::pair<std::string, int64_t>> region_starts;
  for (size_t i = 0; i < registered.size(); ++i) {
    const cuda_ipc::ProtocolRegion& r = L.regions[i];
    if (r.bytes == 0) continue;
    for (const gpu::RegionRange& x : registered[i].ranges(r.off, nranks, me, limits.protocols[i]))
      ranges[x.name].push_back({x.begin, x.end});
    region_starts.push_back({registered[i].name, r.off});
    py::dict d;
    d["off"] = r.off;
    d["bytes"] = r.bytes;
    d["param"] = r.param;
    region_sizes[registered[i].name] = d;
  }
  for (int b = 0; b < cuda_ipc::kMaxCollBlocks; ++b) {
    const int64_t pu = L.split.pushed_offset(b);
    ranges["split"].push_back({pu, pu + 8});
    const int64_t re = L.split.reduced_offset(b);
    ranges["split"].push_back({re, re + 8});
  }
  ranges["split.claim"].push_back({L.split.off_claim, L.split.off_claim + 8});
  for (int q = 0; q < nranks; ++q) {
    if (q == me) continue;
    for (int b = 0; b < cuda_ipc::kMaxCollBlocks; ++b) {
      for (int s = 0; s < L.split.nslots; ++s) {
        const int64_t t = L.split.tag_offset(q, b, s);
        ranges["split.tag"].push_back({t, t + 8});
      }
    }
  }
  ranges["split.ready"].push_back({L.split.ready_offset(0), L.split.ready_offset(cuda_ipc::kMaxClaimedChunks)});
  // Where make_layout placed each region (a region may use anything up to the next one).
  const std::vector<std::pair<std::string, int64_t>> starts = {
      {"abort", L.off_abort},           {"claim", L.off_claim},
      {"coll.tail", L.coll.off_tail},   {"coll.head", L.coll.off_head},
      {"coll.check", L.coll.off_check}, {"coll.sent", L.coll.off_sent},
      {"coll.recvd", L.coll.off_recvd}, {"p2p.tail", L.p2p.off_tail},
      {"p2p.head", L.p2p.off_head},     {"p2p.check", L.p2p.off_check},
      {"p2p.sent", L.p2p.off_sent},     {"p2p.recvd", L.p2p.off_recvd},
      {"coll.data", L.coll.off_data},   {"p2p.data", L.p2p.off_data},
      {"ll.epoch", L.ll.off_epoch},     {"ll.data", L.ll.off_data},
      {"split", L.split.off},           {"split.claim", L.split.off_claim},
      {"split.tag", L.split.off_tag},   {"split.ready", L.split.off_ready}};
  std::vector<std::pair<std::string, int64_t>> all_starts = starts;
  all_starts.insert(all_starts.end(), region_starts.begin(), region_starts.end());
  py::dict d;
  d["total_bytes"] = L.total_bytes;
  d["coll_slot_bytes"] = L.coll.slot_bytes;
  d["coll_blocks"] = L.coll.nblocks;
  d["ll_block_payload_bytes"] = int64_t(L.ll.block_lines - 1) * 8;
  d["ll_blocks"] = L.ll.nblocks;
  d["ll_max_bytes"] = cuda_ipc::kLLMaxBytes;
  d["regions"] = region_sizes;
  d["starts"] = all_starts;
  d["ranges"] = ranges;
  return d;
}

}  // namespace

void register_layout(py::module_& m) {
  m.def("cuda_workspace_layout", &layout_report, py::arg("nranks"), py::arg("rank") = 0, py::arg("coll_slot_bytes") = 0,
        py::arg("coll_blocks") = cuda_ipc::kCollBlocks, py::arg("protocols") = std::map<std::string, int64_t>{},
        "The CUDA IPC workspace layout of `rank` in a group of `nranks`: region start offsets, every byte "
        "range the layout's offset functions address in that rank's workspace, and the sizes. `protocols`: "
        "the limit in bytes of each registered all_reduce protocol with a region (by name; absent: none).");
  m.def(
      "cuda_check_word",
      [](int op, int dtype, int reduce_op, int root, int64_t count, int plan) {
        return cuda_ipc::collective_check_word(op, dtype, reduce_op, root, count,
                                               static_cast<cuda_ipc::CheckPlan>(plan));
      },
      py::arg("op"), py::arg("dtype"), py::arg("reduce_op"), py::arg("root"), py::arg("count"), py::arg("plan"),
      "The word a CUDA collective's messages carry (transport/cuda_ipc/check_word.h); op, dtype and plan as "
      "integers (OpCode, DType, CheckPlan).");
  m.def(
      "describe_cuda_check_word",
      [](uint64_t word) { return cuda_ipc::describe_check(cuda_ipc::decode_check_word(word)); }, py::arg("word"),
      "What a rank called, as the op-mismatch error names it.");
}

}  // namespace pycoll

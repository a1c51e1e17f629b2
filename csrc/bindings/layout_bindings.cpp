#include "bindings/layout_bindings.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

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

py::dict layout_report(int nranks, int me, int64_t coll_slot_bytes, int coll_blocks, int64_t ll128_max_bytes) {
  if (nranks < 2 || nranks > cuda_ipc::kMaxRanks) throw py::value_error("nranks must be in 2..8");
  if (me < 0 || me >= nranks) throw py::value_error("rank must be in 0..nranks-1");
  if (coll_blocks < cuda_ipc::kCollBlocks || coll_blocks > cuda_ipc::kMaxCollBlocks)
    throw py::value_error("coll_blocks must be in 64..128");
  if (ll128_max_bytes < 0) throw py::value_error("ll128_max_bytes must be >= 0");
  const Layout L = cuda_ipc::make_layout(nranks, coll_slot_bytes, coll_blocks, ll128_max_bytes);
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
  if (L.ll128.max_bytes > 0) {
    for (int b = 0; b < cuda_ipc::kLL128Blocks; ++b) {
      const int64_t e = L.ll128.epoch_offset(b);
      ranges["ll128.epoch"].push_back({e, e + 8});
    }
    for (int q = 0; q < nranks; ++q) {
      if (q == me) continue;
      for (int kind = 0; kind < 2; ++kind) {
        for (int b = 0; b < cuda_ipc::kLL128Blocks; ++b) {
          const int64_t h = L.ll128.header_offset(nranks, q, me, kind, b);
          ranges["ll128.header"].push_back({h, h + cuda_ipc::kLL128LineBytes});
        }
      }
      for (int phase = 0; phase < 2; ++phase) {  // one range per (sender, phase): every line
        const int64_t first = L.ll128.line_offset(nranks, q, me, phase, 0);
        const int64_t last = L.ll128.line_offset(nranks, q, me, phase, L.ll128.max_lines - 1);
        ranges["ll128.data"].push_back({first, last + cuda_ipc::kLL128LineBytes});
      }
    }
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
  for (int c = 0; c < cuda_ipc::kTraceCtas; ++c) {
    ranges["trace"].push_back({L.trace.event_offset(c, 0), L.trace.event_offset(c, cuda_ipc::kTraceEvents - 1) + 8});
  }
  // Where make_layout placed each region (a region may use anything up to the next one).
  const std::vector<std::pair<std::string, int64_t>> starts = {
      {"abort", L.off_abort},          {"claim", L.off_claim},          {"coll.tail", L.coll.off_tail},
      {"coll.head", L.coll.off_head},  {"coll.check", L.coll.off_check}, {"coll.sent", L.coll.off_sent},
      {"coll.recvd", L.coll.off_recvd}, {"p2p.tail", L.p2p.off_tail},   {"p2p.head", L.p2p.off_head},
      {"p2p.check", L.p2p.off_check},  {"p2p.sent", L.p2p.off_sent},    {"p2p.recvd", L.p2p.off_recvd},
      {"coll.data", L.coll.off_data},  {"p2p.data", L.p2p.off_data},    {"ll.epoch", L.ll.off_epoch},
      {"ll.data", L.ll.off_data},      {"split", L.split.off},          {"split.claim", L.split.off_claim},
      {"split.tag", L.split.off_tag},  {"split.ready", L.split.off_ready}, {"trace", L.trace.off}};
  std::vector<std::pair<std::string, int64_t>> all_starts = starts;
  if (L.ll128.max_bytes > 0) {
    all_starts.push_back({"ll128.epoch", L.ll128.off_epoch});
    all_starts.push_back({"ll128.header", L.ll128.off_header});
    all_starts.push_back({"ll128.data", L.ll128.off_data});
  }
  py::dict d;
  d["total_bytes"] = L.total_bytes;
  d["coll_slot_bytes"] = L.coll.slot_bytes;
  d["coll_blocks"] = L.coll.nblocks;
  d["ll_block_payload_bytes"] = int64_t(L.ll.block_lines - 1) * 8;
  d["ll_blocks"] = L.ll.nblocks;
  d["ll_max_bytes"] = cuda_ipc::kLLMaxBytes;
  d["ll128_max_lines"] = L.ll128.max_lines;
  d["starts"] = all_starts;
  d["ranges"] = ranges;
  return d;
}

}  // namespace

void register_layout(py::module_& m) {
  m.def("cuda_workspace_layout", &layout_report, py::arg("nranks"), py::arg("rank") = 0,
        py::arg("coll_slot_bytes") = 0, py::arg("coll_blocks") = cuda_ipc::kCollBlocks,
        py::arg("ll128_max_bytes") = 0,
        "The CUDA IPC workspace layout of `rank` in a group of `nranks`: region start offsets, every byte "
        "range the layout's offset functions address in that rank's workspace, and the sizes.");
  m.def(
      "ll128_lines_for", [](int64_t bytes, int nranks) { return cuda_ipc::ll128_lines_for(bytes, nranks); },
      py::arg("bytes"), py::arg("nranks"),
      "Lines of 120 payload bytes one segment of a `bytes` all_reduce over `nranks` needs at most (layout.h).");
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

#include "bindings/schedule_bindings.h"

#include <pybind11/stl.h>

#include <stdexcept>
#include <tuple>
#include <vector>

#include "cpu/schedule_program.h"
#include "transport/transport.h"

namespace py = pybind11;

namespace pycoll {

namespace {

// One step as engine_tables.py writes it: op, src (buffer, first, count), dst (the same), peer,
// seq, channel, peer_channel, channel_messages, deps_begin, deps_end, then the fused send's peer,
// seq, channel, peer_channel, channel_messages.
using StepRow =
    std::tuple<int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int>;
using RankRow = std::tuple<std::vector<std::vector<StepRow>>, std::vector<std::pair<int, int>>>;
using ProgramRow =
    std::tuple<std::string, int, int, int, int, int, bool, int, uint64_t, int, int64_t, int, std::vector<RankRow>>;

ScheduleRegion region(int buffer, int first, int count) {
  if (buffer < 0 || buffer > 2) throw std::invalid_argument("schedule table: a buffer is 0, 1 or 2");
  return ScheduleRegion{static_cast<ScheduleBuffer>(buffer), first, count};
}

std::shared_ptr<const ScheduleProgram> program_of(const ProgramRow& row, OpCode op) {
  auto p = std::make_shared<ScheduleProgram>();
  const auto& [name, ranks, chunks, scratch, depth, lanes, inplace, root, digest, max_chunks, max_messages,
               slot_channels, rank_rows] = row;
  p->name = name;
  p->op = op;
  p->ranks = ranks;
  p->chunks = chunks;
  p->scratch = scratch;
  p->channel_depth = depth;
  p->lanes = lanes;
  p->inplace = inplace;
  p->root = root;
  p->digest = digest;
  p->max_message_chunks = max_chunks;
  p->max_channel_messages = max_messages;
  p->slot_channels = slot_channels;
  if (chunks < 1 || depth < 1 || lanes < 1 || lanes > kMaxLanes || static_cast<int>(rank_rows.size()) != ranks) {
    throw std::invalid_argument("schedule table: bad header (chunks, depth, lanes or ranks)");
  }
  for (const auto& [lane_rows, deps] : rank_rows) {
    RankSchedule rs;
    for (const auto& [l, i] : deps) rs.deps.push_back(ScheduleDep{l, i});
    for (const auto& steps : lane_rows) {
      std::vector<ScheduleStep> lane;
      lane.reserve(steps.size());
      for (const auto& [o, sb, sf, sc, db, df, dc, peer, seq, ch, pch, cm, d0, d1, tp, ts, tch, tpch, tcm] : steps) {
        const auto channel_ok = [](int c) { return c >= 0 && c < kMaxScheduleChannels; };
        if (o < 0 || o > 6 || !channel_ok(ch) || !channel_ok(pch) || !channel_ok(tch) || !channel_ok(tpch) || d0 < 0 ||
            d1 < d0 || d1 > static_cast<int>(rs.deps.size())) {
          throw std::invalid_argument("schedule table: bad step");
        }
        ScheduleStep s;
        s.op = static_cast<ScheduleOp>(o);
        s.src = region(sb, sf, sc);
        s.dst = region(db, df, dc);
        s.peer = peer;
        s.seq = seq;
        s.channel = ch;
        s.peer_channel = pch;
        s.channel_messages = cm;
        s.deps_begin = d0;
        s.deps_end = d1;
        s.to_peer = tp;
        s.to_seq = ts;
        s.to_channel = tch;
        s.to_peer_channel = tpch;
        s.to_channel_messages = tcm;
        lane.push_back(s);
      }
      rs.lanes.push_back(std::move(lane));
    }
    p->rank.push_back(std::move(rs));
  }
  return p;
}

}  // namespace

void register_schedules(py::module_& m) {
  m.def(
      "set_schedule_source",
      [](py::object fn) {
        if (fn.is_none()) {
          set_schedule_source(nullptr);
          return;
        }
        // Kept for the life of the process, never destroyed: the engine may ask it until exit.
        auto* keep = new py::object(std::move(fn));
        set_schedule_source([keep](const std::string& name, OpCode op, int ranks) {
          const char* collective = schedule_collective_name(op);
          if (!collective) return std::shared_ptr<const ScheduleProgram>();
          py::gil_scoped_acquire gil;
          try {
            py::object row = (*keep)(name, collective, ranks);
            if (row.is_none()) return std::shared_ptr<const ScheduleProgram>();
            return program_of(row.cast<ProgramRow>(), op);
          } catch (py::error_already_set& e) {
            throw std::invalid_argument(std::string(py::str(e.value())));
          } catch (const py::cast_error& e) {
            throw std::invalid_argument(std::string("schedule table: ") + e.what());
          }
        });
      },
      py::arg("source"),
      "source(name, collective, ranks) -> None (a program of another collective) or the program's "
      "tables (pycollectives/schedule/engine_tables.py); raising names what is wrong.");
  m.def("forget_schedule_programs", &forget_schedule_programs,
        "Drops the programs the engine keeps (after unregister_algorithm).");
  m.attr("SCHEDULE_MAX_CHANNELS") = kMaxScheduleChannels;
  m.attr("SCHEDULE_MAX_LANES") = kMaxLanes;
}

}  // namespace pycoll

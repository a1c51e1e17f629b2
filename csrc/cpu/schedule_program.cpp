#include "cpu/schedule_program.h"

#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

namespace pycoll {

namespace {
struct Programs {
  std::mutex mu;
  ScheduleSource source;
  std::map<std::tuple<std::string, int, int>, std::shared_ptr<const ScheduleProgram>> kept;
};
Programs& programs() {
  static Programs p;
  return p;
}
}  // namespace

void set_schedule_source(ScheduleSource source) {
  Programs& p = programs();
  std::lock_guard<std::mutex> lock(p.mu);
  p.source = std::move(source);
  p.kept.clear();
}

std::shared_ptr<const ScheduleProgram> schedule_program(const std::string& name, OpCode op, int ranks) {
  Programs& p = programs();
  const auto key = std::make_tuple(name, static_cast<int>(op), ranks);
  ScheduleSource source;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.kept.find(key);
    if (it != p.kept.end()) return it->second;
    source = p.source;
  }
  if (!source) {
    throw std::invalid_argument("pycoll: algorithm '" + name +
                                "' is a schedule program, but no package provides them (import pycollectives)");
  }
  // Asked without the lock: the source may take long (it imports, builds and checks the program).
  std::shared_ptr<const ScheduleProgram> prog = source(name, op, ranks);
  std::lock_guard<std::mutex> lock(p.mu);
  return p.kept.emplace(key, std::move(prog)).first->second;
}

void forget_schedule_programs() {
  Programs& p = programs();
  std::lock_guard<std::mutex> lock(p.mu);
  p.kept.clear();
}

const char* schedule_collective_name(OpCode op) {
  switch (op) {
    case OpCode::AllReduce: return "all_reduce";
    case OpCode::ReduceScatter: return "reduce_scatter";
    case OpCode::AllGather: return "all_gather";
    case OpCode::Broadcast: return "broadcast";
    case OpCode::Reduce: return "reduce";
    case OpCode::AllToAll: return "all_to_all";
    default: return nullptr;
  }
}

}  // namespace pycoll

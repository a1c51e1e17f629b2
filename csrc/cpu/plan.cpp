#include "cpu/plan.h"

#include <stdexcept>

#include "cpu/cost_table.h"
#include "cpu/pipelined.h"

namespace pycoll {

namespace {

// Which algorithms the CPU engine implements for an op (a request for another asks the cost table).
bool algorithm_available(OpCode op, Algo algo) {
  switch (op) {
    case OpCode::AllReduce: return is_single_host_algo(algo);
    case OpCode::AllGather:
    case OpCode::ReduceScatter: return algo == Algo::OneShot || algo == Algo::TwoShot || algo == Algo::Ring;
    case OpCode::Broadcast:
    case OpCode::Reduce: return algo == Algo::OneShot || algo == Algo::TwoShot || algo == Algo::Tree;
    default: return algo == Algo::OneShot;
  }
}

Algo resolve(OpCode op, Algo requested, size_t bytes, int ranks) {
  if (ranks == 1) return Algo::OneShot;
  if (requested != Algo::Auto && algorithm_available(op, requested)) {
    // The direct all_gather is the one-shot, the direct reduce_scatter the two-shot; broadcast and
    // reduce have a one-shot only.
    if (op == OpCode::AllGather && requested == Algo::TwoShot) return Algo::OneShot;
    if (op == OpCode::ReduceScatter && requested == Algo::OneShot) return Algo::TwoShot;
    if ((op == OpCode::Broadcast || op == OpCode::Reduce) && requested == Algo::TwoShot) return Algo::OneShot;
    return requested;
  }
  return cheapest_algorithm(op, bytes, ranks);
}

// A one-shot all_reduce publishes its input with the op header when it fits one half of the data
// region (cache-line aligned): one barrier in all.
bool eager(size_t bytes, size_t workspace_bytes) { return bytes <= (workspace_bytes / 2 & ~size_t(63)); }

// Whether an op over shared tensors works on them in place rather than staging them.
bool maps_shared(OpCode op, size_t bytes, int lanes) {
  if (lanes > 1) return true;
  if (op == OpCode::AllGather) return bytes < kSharedOneLaneAllGatherMaxBytes;
  if (op == OpCode::Broadcast) return bytes < kSharedOneLaneBroadcastMaxBytes;
  return true;
}

bool reads_peers(const CpuOpFacts& f, size_t bytes) {
  if (f.peer_read == PeerRead::Off || f.probe == PeerReadProbe::Denied) return false;
  return f.peer_read == PeerRead::On || auto_reads_in_place(f.op, bytes, f.ranks, f.threads);
}

size_t mib(size_t bytes) { return bytes / kPlanMiB; }

}  // namespace

const char* cpu_path_name(CpuPath p) {
  switch (p) {
    case CpuPath::Eager: return "eager";
    case CpuPath::Direct: return "direct";
    case CpuPath::Pipelined: return "pipelined";
    case CpuPath::Mapped: return "mapped in place";
    case CpuPath::ReadInPlace: return "read in place";
  }
  return "?";
}

bool auto_reads_in_place(OpCode op, size_t bytes, int ranks, int threads) {
  switch (op) {
    case OpCode::AllGather: return bytes >= kPeerReadAllGatherMinBytes && threads >= kPeerReadMinThreads;
    case OpCode::ReduceScatter:
      return bytes >= (ranks <= kPeerReadFewRanks ? kPeerReadFewRanksReduceScatterMinBytes
                                                  : kPeerReadReduceScatterMinBytes) &&
             threads >= (ranks >= kPeerReadManyRanks ? kPeerReadManyRanksReduceScatterMinThreads : kPeerReadMinThreads);
    default: return false;
  }
}

bool may_ever_read_in_place(PeerRead mode, int ranks, int threads) {
  if (ranks < 2 || mode == PeerRead::Off) return false;
  if (mode == PeerRead::On) return true;
  constexpr size_t kAnySize = size_t(1) << 62;
  return auto_reads_in_place(OpCode::AllGather, kAnySize, ranks, threads) ||
         auto_reads_in_place(OpCode::ReduceScatter, kAnySize, ranks, threads);
}

CpuPlan plan_cpu_op(const CpuOpFacts& f) {
  CpuPlan p;
  p.op = f.op;
  const size_t block = static_cast<size_t>(f.count) * dtype_size(f.dtype);
  switch (f.op) {
    case OpCode::AllReduce:
    case OpCode::Reduce:
    case OpCode::Broadcast: p.bytes = block; break;
    case OpCode::AllGather:
    case OpCode::ReduceScatter: p.bytes = block * static_cast<size_t>(f.ranks); break;
    default: throw std::invalid_argument(std::string("cpu plan: ") + op_name(f.op) + " has no plan");
  }
  p.algo = resolve(f.op, f.requested, p.bytes, f.ranks);
  if (p.algo == Algo::Ring || p.algo == Algo::Tree || f.op == OpCode::Reduce) return p;  // Direct
  if (f.op == OpCode::AllReduce) {
    if (p.algo == Algo::OneShot) {
      if (eager(p.bytes, f.workspace_bytes)) p.path = CpuPath::Eager;
      return p;
    }
    p.lanes = pipeline_lanes(p.bytes, f.ranks, f.threads);
    p.path = cpu_pipelines(p.bytes, f.ranks) && f.memory != CpuMemory::Private ? CpuPath::Mapped : CpuPath::Pipelined;
    return p;
  }
  // broadcast, all_gather, reduce_scatter: the direct form, pipelined when large.
  if (!cpu_pipelines(p.bytes, f.ranks)) return p;
  p.lanes = pipeline_lanes(p.bytes, f.ranks, f.threads);
  // Among collectives only all_gather streams its output: all_reduce and broadcast run in place
  // (the lines are in the cache), reduce_scatter was no faster
  // (docs/decisions/0021-streaming-stores-for-large-cpu-outputs.md).
  p.stream_out = f.op == OpCode::AllGather && p.bytes >= f.stream_min_bytes;
  if (f.memory != CpuMemory::Private && maps_shared(f.op, p.bytes, p.lanes)) {
    p.path = CpuPath::Mapped;
    p.root_writes =
        f.op == OpCode::Broadcast && f.memory == CpuMemory::SharedEvery && p.lanes <= kBroadcastRootWritesMaxLanes;
  } else if (reads_peers(f, p.bytes)) {
    p.path = CpuPath::ReadInPlace;
    p.probe_first = f.probe == PeerReadProbe::NotYet;
  } else {
    p.path = CpuPath::Pipelined;
  }
  return p;
}

std::string CpuPlan::describe() const {
  if (algo == Algo::Tree) return "pipelined_binary_tree";  // not the CUDA engine's double binary tree
  if (algo == Algo::Ring) return "ring";
  if (algo == Algo::Schedule) return "schedule " + schedule + " lanes=" + std::to_string(lanes);
  std::string s = cpu_path_name(path);
  if (lanes > 0) s += " lanes=" + std::to_string(lanes);
  s += std::string(" ") + algo_name(algo);
  if (root_writes) s += " root-writes";
  if (stream_out) s += " streamed";
  if (probe_first) s += " probe-first";
  return s;
}

std::string peer_read_setting_help() {
  const std::string few = std::to_string(kPeerReadFewRanks), many = std::to_string(kPeerReadManyRanks);
  return "Large CPU all_gather, reduce_scatter and broadcast: read each peer's buffer in place "
         "with cross-memory attach (on) or stage it through shared memory (off); auto reads in "
         "place, when every rank has at least " +
         std::to_string(kPeerReadMinThreads) + " threads (PYCOLL_CPU_THREADS), an all_gather of " +
         std::to_string(mib(kPeerReadAllGatherMinBytes)) + " MiB or more and a reduce_scatter of " +
         std::to_string(mib(kPeerReadFewRanksReduceScatterMinBytes)) + " MiB or more over " + few + " ranks, " +
         std::to_string(mib(kPeerReadReduceScatterMinBytes)) + " MiB or more over " +
         std::to_string(kPeerReadFewRanks + 1) + " or more (over " + many + " or more, " +
         std::to_string(kPeerReadManyRanksReduceScatterMinThreads) +
         " threads are enough for a reduce_scatter). Ranks that differ use the least (off, then auto, then on). "
         "Under Yama's ptrace_scope=1 (Ubuntu's default), a rank that may read in place names the ranks' "
         "nearest common ancestor (their launcher) as its tracer, so that its sibling ranks may read it; off "
         "names none. Where the OS forbids cross-memory attach, ops stage and the debug log says so once.";
}

std::string shared_tensors_setting_help() {
  return "Large CPU all_reduce, reduce_scatter, all_gather and broadcast whose tensors live in shared memory "
         "(tensor.share_memory_()) on every rank the op reads from: map the peers' files and read them in place "
         "(on; with one thread per rank an all_gather of " +
         std::to_string(mib(kSharedOneLaneAllGatherMaxBytes)) + " MiB or more and a broadcast of " +
         std::to_string(mib(kSharedOneLaneBroadcastMaxBytes)) +
         " MiB or more still stage, which is faster there) or stage them like any tensor (off). A send larger "
         "than PYCOLL_P2P_CHANNEL_BYTES from such a tensor, where the ranks have fewer than two CPUs each, goes "
         "by reference: the receiver copies it straight out of the sender's file (on) instead of through the "
         "channel; a private send as large into such a tensor is written by the sender straight into the "
         "receiver's file. Where the OS forbids opening a peer's file, ops stage and the debug log says so once.";
}

}  // namespace pycoll

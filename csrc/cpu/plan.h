// The CPU engine's plan: the one place that turns what is known of a collective (the op and its
// size, the group, the threads every rank offers, where the ranks' buffers live, the peer-read
// setting and what the group found the OS allows) into what runs: the algorithm, how the data
// moves, the lanes. The engine plans, then executes the plan; where an op finds a fact out on
// the way (a peer's file that cannot be mapped, the first probe of cross-memory attach), it plans
// again with that fact. The PYCOLL_DEBUG=INFO line shows describe(). Plain C++ without state of
// its own but the cost table (cpu/cost_table.h), tested directly (tests/test_cpu_plan.py through
// _C.cpu_plan).
//
// Every input after the header exchange comes from every rank's op header and the group's votes,
// so every rank plans the same: the schedules rely on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/types.h"

namespace pycoll {

constexpr size_t kPlanKiB = size_t(1) << 10, kPlanMiB = size_t(1) << 20;  // the units below

// Broadcast, all_gather and reduce_scatter run pipelined from this size of the op's buffer
// (bytes; all_gather and reduce_scatter count all n blocks): below it the direct form's one
// barrier is as fast. The two-shot all_reduce is pipelined at every size.
// docs/decisions/0024-cpu-pipelined-from-256-kib.md
constexpr size_t kPipelineMinBytes = 256 * kPlanKiB;

// With one lane, an all_gather from this size (bytes of the output) stages even where it could
// read shared tensors in place: every rank reading every input from memory costs more than the
// staging copy once the buffers leave the cache. docs/decisions/0023-cpu-shared-tensor-staging-thresholds.md
constexpr size_t kSharedOneLaneAllGatherMaxBytes = 16 * kPlanMiB;
// The same for a broadcast, from this size (bytes). Same record.
constexpr size_t kSharedOneLaneBroadcastMaxBytes = 64 * kPlanMiB;
// A broadcast over shared tensors splits the copying between the root and the readers up to this
// many lanes; with more, the root's lanes only compete for the host's CPUs. Same record.
constexpr int kBroadcastRootWritesMaxLanes = 2;

// PYCOLL_CPU_PEER_READ=auto reads private buffers in place only where the kernel's page pinning
// costs less than the staging copy saves: docs/decisions/0022-cpu-peer-read-rule.md.
// all_gather: from this size (bytes of the output)...
constexpr size_t kPeerReadAllGatherMinBytes = 64 * kPlanMiB;
// ...reduce_scatter over at most kPeerReadFewRanks ranks: from this size (bytes of the input)...
constexpr size_t kPeerReadFewRanksReduceScatterMinBytes = 16 * kPlanMiB;
constexpr int kPeerReadFewRanks = 2;
// ...over more ranks: from this size (bytes of the input)...
constexpr size_t kPeerReadReduceScatterMinBytes = 6 * kPlanMiB;
// ...with at least this many threads on every rank...
constexpr int kPeerReadMinThreads = 4;
// ...or, a reduce_scatter over kPeerReadManyRanks ranks or more, this many. Broadcast: never.
constexpr int kPeerReadManyRanksReduceScatterMinThreads = 3;
constexpr int kPeerReadManyRanks = 4;

// PYCOLL_CPU_PEER_READ, ordered: ranks that differ use the least (OpHeader::peer_read).
enum class PeerRead : int32_t { Off = 0, Auto = 1, On = 2 };
// Whether the group's probe found that every rank may read its peers with cross-memory attach
// (cpu/peer_read.h); the probe runs the first time the plan would read in place.
enum class PeerReadProbe : int32_t { NotYet = 0, Allowed = 1, Denied = 2 };

// Where the ranks' buffers of an op live.
enum class CpuMemory : int32_t {
  // Some buffer the op would read in place of a peer is private memory (or some rank has
  // PYCOLL_CPU_SHARED_TENSORS off, or the group may not open peers' files, or this op's mapping
  // failed).
  Private = 0,
  // Every buffer the op reads of a peer lives in a shared-memory file (all_reduce: every input
  // and output; broadcast: the root's), but not every rank's buffer.
  Shared = 1,
  // Every rank's buffers do (broadcast: the root may write into the readers').
  SharedEvery = 2,
};

// How an op moves its data.
enum class CpuPath : int32_t {
  Eager = 0,        // one-shot all_reduce: the data goes with the op header, one barrier in all
  Direct = 1,       // through one half of the data region per phase, a barrier between (ring, tree too)
  Pipelined = 2,    // staged through per-lane rings of slots (cpu/pipelined.h)
  Mapped = 3,       // the peers' shared-memory files mapped and used in place (cpu/shared_storage.h)
  ReadInPlace = 4,  // the peers' buffers read with cross-memory attach (cpu/peer_read.h)
};

// The words the debug log uses: "eager", "direct", "pipelined", "mapped in place", "read in place".
const char* cpu_path_name(CpuPath p);

// What the plan is made from. Before the header exchange the engine knows only its own facts and
// uses the plan's algorithm and whether it is eager (both depend on nothing else); after it, every
// field is what all ranks agree on.
struct CpuOpFacts {
  OpCode op = OpCode::AllReduce;  // all_reduce, reduce, broadcast, all_gather or reduce_scatter
  int64_t count = 0;              // elements of the tensor; all_gather, reduce_scatter: of one rank's block
  DType dtype = DType::Float32;
  int ranks = 1;
  Algo requested = Algo::Auto;  // Auto: the cost table; an algorithm the op lacks also asks it
  size_t workspace_bytes = 0;   // each rank's collective data region (PYCOLL_SHM_BYTES, rounded)
  int threads = 1;              // the fewest threads any rank offers (PYCOLL_CPU_THREADS)
  CpuMemory memory = CpuMemory::Private;
  PeerRead peer_read = PeerRead::Off;  // the least any rank set
  PeerReadProbe probe = PeerReadProbe::NotYet;
  size_t stream_min_bytes = SIZE_MAX;  // this rank's: outputs from this size are written with streaming stores
};

struct CpuPlan {
  OpCode op = OpCode::AllReduce;
  size_t bytes = 0;           // the op's buffer: all_gather and reduce_scatter count all n blocks
  Algo algo = Algo::OneShot;  // one-shot, two-shot, ring or tree
  CpuPath path = CpuPath::Direct;
  int lanes = 0;             // threads per rank moving the data; 0 off the pipelined paths
  bool root_writes = false;  // Mapped broadcast: the root writes part of every reader's buffer
  bool stream_out = false;   // all_gather: the output written with streaming stores (cpu/kernels/stream_store.h)
  bool probe_first = false;  // ReadInPlace before the group's probe: the engine probes, then plans again
  std::string schedule;      // algo Schedule: the program's name (not planned here: cpu/schedule_run.h)

  // "mapped in place lanes=3 twoshot", "direct oneshot", "pipelined_binary_tree", ... for the
  // debug log: the path first, as the log has always named it.
  std::string describe() const;
  // Whether o's describe() is this one's (what it prints: not the op or its size).
  bool describes_as(const CpuPlan& o) const {
    return algo == o.algo && path == o.path && lanes == o.lanes && root_writes == o.root_writes &&
           stream_out == o.stream_out && probe_first == o.probe_first && schedule == o.schedule;
  }
};

// Throws std::invalid_argument for an op the plan does not cover (gather, scatter, all_to_all and
// barrier run their one direct form).
CpuPlan plan_cpu_op(const CpuOpFacts& f);

// Whether an op of `bytes` over `ranks` runs a pipelined path (broadcast, all_gather, reduce_scatter).
inline bool cpu_pipelines(size_t bytes, int ranks) { return ranks > 1 && bytes >= kPipelineMinBytes; }
// PYCOLL_CPU_PEER_READ=auto's rule for a private buffer of an op (docs/decisions/0022-cpu-peer-read-rule.md).
bool auto_reads_in_place(OpCode op, size_t bytes, int ranks, int threads);
// Whether a rank with `mode` and `threads` may ever read its peers in place, at any size: only then
// does it name a tracer for them (common/ptracer.h).
bool may_ever_read_in_place(PeerRead mode, int ranks, int threads);

// The help texts of PYCOLL_CPU_PEER_READ and PYCOLL_CPU_SHARED_TENSORS, which quote the thresholds above.
std::string peer_read_setting_help();
std::string shared_tensors_setting_help();

}  // namespace pycoll

// The CPU engine of one group: owns the shared-memory transport, checks that
// every rank called the same collective (op header exchange), plans it (cpu/plan.h)
// and runs the plan. Works on raw pointers; the backend does the torch
// side (argument checks, contiguity, futures). Collectives must be called
// from one thread at a time, in the same order on every rank; point-to-point
// runs on its own threads.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cpu/context.h"
#include "cpu/lane_pool.h"
#include "cpu/p2p.h"
#include "cpu/pipelined.h"
#include "cpu/plan.h"
#include "cpu/shared_storage.h"
#include "common/rendezvous.h"
#include "common/types.h"

namespace pycoll {

// The shared-memory files behind an op's buffers, where they have one (engines/shared_storage_ref.h).
struct SharedRefs {
  SharedStorageRef in;   // broadcast: the buffer
  SharedStorageRef out;  // all_reduce only
};

class CpuEngine {
 public:
  CpuEngine(Rendezvous rv, int rank, int size, std::chrono::milliseconds timeout);
  ~CpuEngine();

  // Each returns the algorithm that ran. `algo` Auto asks the cost table (cpu/cost_table.h).
  // `shared`: where the buffers live in shared-memory files; large ops read peers' in place when
  // every buffer they read has one (cpu/shared_storage.h).
  Algo all_reduce(const char* in, char* out, int64_t count, DType t, ReduceKind op, Algo algo,
                  const SharedRefs& shared = {});
  Algo reduce(const char* in, char* out, int64_t count, DType t, ReduceKind op, int root, Algo algo);
  Algo broadcast(char* buf, int64_t count, DType t, int root, Algo algo, const SharedRefs& shared = {});
  Algo all_gather(const char* in, char* out, int64_t m, DType t, Algo algo, const SharedRefs& shared = {});
  Algo reduce_scatter(const char* in, char* out, int64_t m, DType t, ReduceKind op, Algo algo,
                      const SharedRefs& shared = {});
  void gather(const char* in, char* out, int64_t m, DType t, int root);
  void scatter(const char* in, char* out, int64_t m, DType t, int root);
  // Byte counts and offsets per peer.
  void all_to_all(const char* in, char* out, const std::vector<int64_t>& send_bytes,
                  const std::vector<int64_t>& send_off, const std::vector<int64_t>& recv_bytes,
                  const std::vector<int64_t>& recv_off, DType t);
  void barrier();
  // Runs `op` as the schedule program `name` (PYCOLL_ALGO or set_algo names it; cpu/schedule_run.h):
  // false, with nothing done, where that program is one of another collective (the op then runs
  // its auto plan). Buffers as the op's call above takes them; `block`: the elements of one rank's
  // message (all_to_all: bytes, blocks of one size only: `uneven` raises on every rank). Every
  // rank compares the program's digest in its op header: different programs raise on every rank.
  bool run_schedule(const std::string& name, OpCode op, const char* in, char* out, int64_t block, DType t, ReduceKind r,
                    int root, bool uneven = false);

  PointToPoint& p2p();
  // Makes every blocked wait throw; the engine is unusable afterwards.
  void abort();
  int rank() const { return rank_; }
  int size() const { return size_; }
  uint64_t seq() const { return seq_; }
  // The plan the last collective ran (none for gather, scatter, all_to_all and barrier): for the debug log.
  const std::optional<CpuPlan>& last_plan() const { return last_plan_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  // Whether an op of `bytes` runs on its calling thread alone, with no lane threads: a waiter may
  // then poll on another CPU without stalling a lane (backend/work.h, poll_before_sleep).
  bool runs_on_one_thread(size_t bytes) const { return !cpu_pipelines(bytes, size_) || threads_ == 1; }

 private:
  void ensure_transport();
  // Whether this rank's setting and threads let any op read its peers in place (auto's rule at
  // any size, or on): only then does it name a tracer for them (common/ptracer.h).
  bool may_ever_read_in_place() const;
  // Publishes this rank's header (and, for one-shot, the first chunk), one
  // barrier, then compares every peer's header: throws the same error on
  // every rank if they differ, leaving all ranks in step for the next op.
  // Publishes this rank's header (and an all_to_all's split tables), meets the peers and checks
  // that every rank called the same op. `algo`, where given, replaces the header's.
  CpuContext begin(const OpHeader& h, Waiter& w, const char* eager = nullptr, size_t eager_bytes = 0,
                   const AllToAllSplits* splits = nullptr, std::optional<Algo> algo = std::nullopt);
  void verify(const OpHeader& mine);
  Waiter waiter(OpCode op);
  // What this rank knows of an op before the header exchange: enough to plan its algorithm and
  // whether it goes eager (cpu/plan.h).
  CpuOpFacts facts(OpCode op, int64_t count, DType t, Algo requested) const;
  // Ring and tree ops end with a barrier: later ops may reuse any slot.
  void finish(CpuContext& c);
  // The pipeline that runs plan `p` (its lanes and whether it streams its output).
  Pipeline pipeline(Waiter& w, const CpuPlan& p);
  // The fewest threads any rank offered the op begun last.
  int offered_threads() const;
  // The least PYCOLL_CPU_PEER_READ any rank set for the op begun last.
  PeerRead agreed_peer_read() const;
  // Where the buffers of the op begun last live (cpu/plan.h, CpuMemory), from every rank's header
  // and what the group knows of opening peers' files.
  CpuMemory memory_of(OpCode op, int root) const;
  // Every rank probes whether it may read its peers (every rank's buffer in OpHeader::addr) with
  // cross-memory attach, and all agree (one extra barrier, once per group): sets peer_read_probe_.
  void probe_peer_read(CpuContext& c);
  // Rank r's header of the op begun last.
  const OpHeader& header_of(int r) const { return transport_->control(r).header[seq_ & 1]; }
  // Every rank's OpHeader::addr for the op begun last.
  std::vector<int64_t> header_addrs() const;
  // Every rank publishes `code` (1 or more) in its counter `slot` for the op begun last and waits
  // for every peer's: the largest code and a rank that gave it, the same on every rank.
  struct Vote {
    uint64_t worst;
    int worst_rank;
  };
  Vote vote(CpuContext& c, Counter ControlBlock::* slot, uint64_t code);
  struct SharedBuffers {
    std::vector<const char*> in;  // every rank's input (broadcast: the root's buffer), where this rank reads it
    std::vector<char*> out;       // every rank's output (broadcast: buffer), writable, where this rank writes it
  };
  // One buffer of rank `rank` that an op reads or writes in place; `mapper`: the one rank that
  // maps it, kEvery for every rank (but its owner), kNobody for a buffer no peer touches that must
  // still not overlap a peer's (a broadcast reader's, when the root does not write).
  struct PeerBuffer {
    int rank;
    const SharedStorageRef* ref;
    size_t bytes;
    int mapper;
    bool write;
    static constexpr int kEvery = -1, kNobody = -2;
  };
  // Every rank's buffers, mapped here, for the op begun last, planned Mapped (`p`): every buffer it
  // reads or writes (every rank's input; all_reduce: the outputs too; broadcast: the root's
  // buffer, and every rank's where p.root_writes) lives in one, no two ranks' overlap, and every
  // rank mapped what it uses of its peers' (one vote, one extra barrier, skipped when every rank
  // is known to hold those mapped already). A peer's file
  // that cannot be opened for writing (not the case for memfd or torch's shared-memory files,
  // which their owner may write) stops the group's use of shared tensors, as a failed read-only
  // open does. nullopt on every rank otherwise.
  std::optional<SharedBuffers> shared_buffers(CpuContext& c, const CpuPlan& p, int root, const char* in,
                                              size_t in_bytes, char* out, size_t out_bytes);
  // The plan of the op begun last, from every rank's header (`mine`: this rank's plan before the
  // exchange, which is the group's for the direct and eager forms): where it says to map the peers'
  // shared files or to probe cross-memory attach first, does that (one vote each, the same on
  // every rank) and plans again with what it found. `mapped`: the buffers, where it runs mapped.
  // Records the plan for last_plan().
  CpuPlan agree(CpuContext& c, CpuOpFacts f, const CpuPlan& mine, int root, const char* in, size_t in_bytes, char* out,
                size_t out_bytes, std::optional<SharedBuffers>& mapped);
  // An op begun: its context, its agreed plan, and its peers' buffers where it runs mapped.
  struct Begun {
    CpuContext c;
    CpuPlan plan;
    std::optional<SharedBuffers> mapped;
  };
  // Plans the op of facts `f` (header `h`, its algorithm from the plan), begins it (an eager
  // one-shot sends `in` with the header) and agrees its plan with every rank (agree()).
  Begun start(const OpHeader& h, Waiter& w, const CpuOpFacts& f, int root, const char* in, size_t in_bytes, char* out,
              size_t out_bytes);
  // Runs the schedule of b.plan's path: `direct()` (ring and tree too), `staged(pipeline)`,
  // `mapped(pipeline, buffers)` or `read(pipeline, every rank's OpHeader::addr)`; the in-place
  // paths end with finish().
  template <typename Direct, typename Staged, typename Mapped, typename Read>
  void execute(Begun& b, Waiter& w, Direct&& direct, Staged&& staged, Mapped&& mapped, Read&& read);

  Rendezvous rv_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> abort_{false};
  std::mutex transport_mu_;
  std::atomic<bool> transport_ready_{false};  // transport_ and p2p_ are made
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<PointToPoint> p2p_;
  uint64_t seq_ = 0;
  uint64_t barrier_epoch_ = 0;
  uint64_t phase_ = 0;
  uint64_t ring_step_ = 0;
  uint64_t up_step_ = 0;
  uint64_t down_step_ = 0;
  int threads_ = 1;  // what this rank offers a pipelined op
  std::optional<CpuPlan> last_plan_;
  bool shared_tensors_on_;  // PYCOLL_CPU_SHARED_TENSORS
  enum class SharedOpen { Unknown, Yes, No } shared_open_ = SharedOpen::Unknown;
  PeerFileMaps peer_files_;
  // Shared files (of any rank) that every rank that maps them (AgreedFile::mapper) holds mapped,
  // writable where AgreedFile::writable, known from the votes: an op that uses only these skips
  // its vote. Identical on every rank.
  struct AgreedFile {
    int rank;
    uint64_t dev, ino;
    int64_t bytes;
    int mapper;     // PeerBuffer::mapper
    bool writable;  // mapped for writing
  };
  std::vector<AgreedFile> agreed_files_;
  static PeerRead parse_peer_read();   // PYCOLL_CPU_PEER_READ
  static bool parse_shared_tensors();  // PYCOLL_CPU_SHARED_TENSORS
  PeerRead peer_read_mode_;
  size_t stream_min_bytes_;  // stream_store_min_bytes(size_), read once
  PeerReadProbe peer_read_probe_ = PeerReadProbe::NotYet;
  std::unique_ptr<LanePool> pool_;  // made on the first op that uses more than one lane
  std::array<uint64_t, kMaxLanes> lane_step_{};
  // Schedule programs: their messages' counters (ControlBlock::schedule_sent) start past this.
  uint64_t schedule_step_ = 0;
  std::unique_ptr<LanePool> schedule_pool_;                          // a program's lanes 1..
  std::vector<char> schedule_in_, schedule_out_, schedule_scratch_;  // copies where buffers must not alias
};

}  // namespace pycoll

// The CPU engine of one group: owns the shared-memory transport, checks that
// every rank called the same collective (op header exchange), picks the
// algorithm and runs it. Works on raw pointers; the backend does the torch
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

  // Each returns the algorithm that ran. `algo` Auto asks the cost model.
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

  PointToPoint& p2p();
  // Makes every blocked wait throw; the engine is unusable afterwards.
  void abort();
  int rank() const { return rank_; }
  int size() const { return size_; }
  uint64_t seq() const { return seq_; }
  // Lanes of the last op if it ran pipelined (cpu/pipelined.h), else 0: for the debug log.
  int last_pipeline_lanes() const { return last_lanes_; }
  // How the last pipelined op moved its data, for the debug log: "pipelined" (staged), "read in
  // place" (cross-memory attach, cpu/peer_read.h) or "mapped in place" (peers' shared-memory
  // files, cpu/shared_storage.h).
  const char* last_data_path() const { return last_data_path_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  // Whether an op of `bytes` runs on its calling thread alone, with no lane threads: a waiter may
  // then poll on another CPU without stalling a lane (backend/work.h, poll_before_sleep).
  bool runs_on_one_thread(size_t bytes) const { return !pipelines(bytes) || threads_ == 1; }

 private:
  void ensure_transport();
  // Whether this rank's setting and threads let any op read its peers in place (auto's rule at
  // any size, or on): only then does it name a tracer for them (common/ptracer.h).
  bool may_ever_read_in_place() const;
  // Publishes this rank's header (and, for one-shot, the first chunk), one
  // barrier, then compares every peer's header: throws the same error on
  // every rank if they differ, leaving all ranks in step for the next op.
  CpuContext begin(OpHeader h, Waiter& w, const char* eager = nullptr, size_t eager_bytes = 0);
  void verify(const OpHeader& mine);
  Waiter waiter(OpCode op);
  Algo resolve(OpCode op, Algo requested, size_t bytes) const;
  // Ring and tree ops end with a barrier: later ops may reuse any slot.
  void finish(CpuContext& c);
  // True when a direct op of `bytes` runs pipelined instead (large messages).
  bool pipelines(size_t bytes) const;
  // The pipeline of the op begun last: lanes agreed from every rank's header. streamed_out_bytes:
  // the size of this rank's output tensor, which the op may write with streaming stores
  // (cpu/kernels/stream_store.h); among collectives all_gather only. 0 for all_reduce and
  // broadcast, which torch.distributed runs in place (the lines are in the cache then; streamed, a
  // 16 MiB all_reduce over 2 ranks on the 2-core CI machine took 3510 us against 2644), and for
  // reduce_scatter, which was no faster.
  Pipeline pipeline(Waiter& w, size_t bytes, size_t streamed_out_bytes);
  // The fewest threads any rank offered the op begun last.
  int offered_threads() const;
  // Whether the all_gather, reduce_scatter or broadcast of `bytes` begun last (every rank's buffer in
  // OpHeader::addr) reads its peers' buffers in place (PYCOLL_CPU_PEER_READ). The first time the
  // rule says yes, every rank probes whether it may, and all agree (one extra barrier, once per group).
  bool reads_in_place(CpuContext& c, OpCode op, size_t bytes);
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
  // Whether the op begun last is worth reading shared tensors in place at all (cpu_engine.cpp:
  // a one-lane all_gather or broadcast of many MiB stages); the same answer on every rank.
  bool worth_reading_shared(OpCode op, size_t bytes) const;
  struct SharedBuffers {
    std::vector<const char*> in;  // every rank's input (broadcast: the root's buffer), where this rank reads it
    std::vector<char*> out;       // every rank's output (broadcast: buffer), writable, where this rank writes it
    bool root_writes;             // broadcast: the root writes part of every buffer (all are shared)
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
  // Every rank's buffers, mapped here, when the op begun last works on its peers' shared-memory
  // files in place: every buffer it reads or writes (every rank's input; all_reduce: the outputs
  // too; broadcast: the root's buffer, and every rank's where the root writes into them) lives in
  // one, no two ranks' overlap, and every rank mapped what it uses of its peers' (one vote, one
  // extra barrier, skipped when every rank is known to hold those mapped already). A peer's file
  // that cannot be opened for writing (not the case for memfd or torch's shared-memory files,
  // which their owner may write) stops the group's use of shared tensors, as a failed read-only
  // open does. nullopt on every rank otherwise.
  std::optional<SharedBuffers> shared_buffers(CpuContext& c, OpCode op, int root, const char* in, size_t in_bytes,
                                              char* out, size_t out_bytes);

  Rendezvous rv_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> abort_{false};
  std::mutex transport_mu_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<PointToPoint> p2p_;
  uint64_t seq_ = 0;
  uint64_t barrier_epoch_ = 0;
  uint64_t phase_ = 0;
  uint64_t ring_step_ = 0;
  uint64_t up_step_ = 0;
  uint64_t down_step_ = 0;
  int threads_ = 1;  // what this rank offers a pipelined op
  int last_lanes_ = 0;
  const char* last_data_path_ = "pipelined";
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
  enum class PeerRead { Off, Auto, On };  // ordered: ranks that differ use the least (OpHeader::peer_read)
  static PeerRead parse_peer_read();      // PYCOLL_CPU_PEER_READ
  static bool parse_shared_tensors();     // PYCOLL_CPU_SHARED_TENSORS
  PeerRead peer_read_mode_;
  size_t stream_min_bytes_;  // stream_store_min_bytes(size_), read once
  enum class PeerReadAllowed { Unknown, Yes, No } peer_read_allowed_ = PeerReadAllowed::Unknown;
  std::unique_ptr<LanePool> pool_;  // made on the first op that uses more than one lane
  std::array<uint64_t, kMaxLanes> lane_step_{};
};

}  // namespace pycoll

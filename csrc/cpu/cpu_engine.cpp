#include "cpu/cpu_engine.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "cpu/direct.h"
#include "cpu/peer_read.h"
#include "cpu/pipelined.h"
#include "cpu/ring.h"
#include "cpu/select.h"
#include "cpu/tree.h"
#include "common/check.h"
#include "common/env.h"
#include "common/ptracer.h"
#include "common/setting.h"
#include "common/test_hooks.h"
#include "cpu/kernels/stream_store.h"
#include "transport/shm/shm_transport.h"

namespace pycoll {

namespace {

// Workspace per rank: collective data and one point-to-point channel per peer. The direct ops use
// the data region as two halves; the pipelined ones as up to kMaxLanes rings of ~1 MiB slots.
// 16 MiB keeps 4 ranks under 64 MiB of /dev/shm.
const IntSetting kShmBytes("PYCOLL_SHM_BYTES", 16 << 20, 1 << 16, int64_t(1) << 34, "cpu engine", true, Audience::User,
                           "Shared memory per rank for the CPU engine's collectives (two halves).", nullptr,
                           /*bytes=*/true);
const IntSetting kP2PChannelBytes("PYCOLL_P2P_CHANNEL_BYTES", 4 << 20, 1 << 12, int64_t(1) << 32, "cpu engine", true,
                                  Audience::User, "Shared memory per peer for the CPU engine's send/recv channel.",
                                  nullptr,
                                  /*bytes=*/true);

const TextSetting kPeerRead("PYCOLL_CPU_PEER_READ", "auto", "auto, on, off", "cpu engine", false, Audience::User,
                            "Large CPU all_gather, reduce_scatter and broadcast: read each peer's buffer in place "
                            "with cross-memory attach (on) or stage it through shared memory (off); auto reads in "
                            "place, when every rank has at least 4 threads (PYCOLL_CPU_THREADS), an all_gather of "
                            "64 MiB or more and a reduce_scatter of 16 MiB or more over 2 ranks, 6 MiB or more over "
                            "3 or more (over 4 or more, 3 threads are enough for a reduce_scatter). Ranks that "
                            "differ use the least (off, then auto, then on). Under Yama's ptrace_scope=1 (Ubuntu's "
                            "default), a rank that may read in place names the ranks' nearest common ancestor (their "
                            "launcher) as its tracer, so that its sibling ranks may read it; off names none. Where "
                            "the OS forbids cross-memory attach, ops stage and the debug log says so once.");
const TextSetting kSharedTensors(
    "PYCOLL_CPU_SHARED_TENSORS", "on", "on, off", "cpu engine", true, Audience::User,
    "Large CPU all_reduce, reduce_scatter, all_gather and broadcast whose tensors "
    "live in shared memory (tensor.share_memory_()) on every rank the op reads from: "
    "map the peers' files and read them in place (on; with one thread per rank an "
    "all_gather of 16 MiB or more and a broadcast of 64 MiB or more still stage, "
    "which is faster there) or stage them like any tensor (off). A send larger than "
    "PYCOLL_P2P_CHANNEL_BYTES from such a tensor, where the ranks have fewer than two CPUs "
    "each, goes by reference: the receiver copies it straight out of the sender's file (on) "
    "instead of through the channel; a private send as large into such a tensor is written "
    "by the sender straight into the receiver's file. Where the OS forbids opening a peer's "
    "file, ops stage "
    "and the debug log says so once.");
// A one-lane all_gather of 16 MiB or more, or broadcast of 64 MiB or more, stages even where it
// could read shared tensors in place. Staged, each input is read from memory once, by its owner,
// and reaches the peers through slots that stay in cache, with the copying spread over every
// rank's core; read in place, every rank reads every input from memory itself. With one thread
// per rank that costs more than the staging copy once the buffers leave the cache (2-core CI
// machine, 2026-11-29, 2 ranks: all_gather 64 MiB 0.82-0.91 of the floor in place against
// 1.04-1.13 staged, 16 MiB about equal; broadcast 64 MiB 1.14-1.23 against 1.49-1.57, 16 MiB
// 1.47-1.89 against 1.06-1.27). With several lanes, in place won or tied at every size measured
// (16-CPU Xeon). reduce_scatter and all_reduce read in place at every size: staging adds a copy.
constexpr size_t kSharedOneLaneAllGatherMaxBytes = size_t(16) << 20;
constexpr size_t kSharedOneLaneBroadcastMaxBytes = size_t(64) << 20;

// A broadcast over shared tensors splits the copying between the root and the readers
// (shared_broadcast) up to this many lanes. With one lane it halves the time (2-core CI machine,
// 2 ranks: 1 MiB 55-71 us against 80-90, 4 MiB 137-175 against 197-226), and with 2 lanes on the
// 16-CPU Xeon too (1 MiB 19-27 us against 30-34, 4 MiB 62-121 against 219-229); with 7 lanes
// the readers' copy alone runs as fast (1-4 MiB within 30% either way with buffers reused), and
// in pycoll-bench, where every row makes new buffers, 4 of 5 launches of the split took 167-220 us
// at 4 MiB against 58-91 in 3 of 4 of the readers' copy: the root's 7 lanes only compete for
// the host's CPUs there (docs/performance.md, "Writing into peers' buffers").
constexpr int kBroadcastRootWritesMaxLanes = 2;

// auto's rule (PYCOLL_CPU_PEER_READ), measured on Xeons of 16 and 32 CPUs (docs/algorithms.md, "CPU
// engine"). The kernel pins the peer's pages on every call, and many lanes pinning at once cost
// more than the staging copy saves until the copies leave the cache:
// - all_gather: in place, 64 MiB took 0.75-0.83x the staged time on 32 CPUs, 1-16 MiB 1.05-3x;
// - broadcast: 0.95-3x at every size, so never;
// - reduce_scatter (sizes are its whole input) stages (n-1)/n of every input, more than an
//   all_gather, and saves more. Median time in place over staged, launches alternated: 32 CPUs,
//   4 ranks (7 threads each) 1.26 at 4 MiB, 0.84 at 8, 0.70 at 16, 0.95 at 32, 0.90 at 64;
//   3 ranks (10 threads) 1.97 at 4 MiB, 0.91 at 8, 0.79 at 16, 0.67 at 32 (sizes a multiple of 3
//   elements, just under these; 6 MiB sits between); 2 ranks (15 threads) 1.33 at 8 MiB, 1.06 at
//   16, 1.02 at 32, 0.88 at 64; 16 CPUs, 2 ranks (7 threads) 0.82 / 0.72 / 0.83 at 16 / 32 /
//   64 MiB on a quiet host, more in two launches on a busy one (1.15-1.45); on 2026-12-02, quiet,
//   three launches each, 1.64 at 4 MiB, 0.83 at 8, 0.85 at 16, 0.67 at 32, 0.90 at 64, and 4
//   ranks (3 threads) 0.96 / 0.82 / 0.68 / 0.80 / 1.09 at 4 / 8 / 16 / 32 / 64 MiB. So 2 ranks
//   from 16 MiB (at most 6% slower on 32 CPUs, 15-33% faster on a quiet 16), and 3 threads are
//   enough over 4+ ranks (2 or 3 ranks were measured with 7 threads or more only).
bool auto_reads_in_place(OpCode op, size_t bytes, int ranks, int threads) {
  constexpr size_t MiB = size_t(1) << 20;
  switch (op) {
    case OpCode::AllGather: return bytes >= 64 * MiB && threads >= 4;
    case OpCode::ReduceScatter: return bytes >= (ranks <= 2 ? 16 : 6) * MiB && threads >= (ranks >= 4 ? 3 : 4);
    default: return false;
  }
}

// Broadcast, all_gather and reduce_scatter run pipelined from this size (cpu/pipelined.h);
// below it the direct ops' single barrier is as fast (both measured within noise at 32-256 KiB
// on the CI machine, the pipelined ones 1.3-1.7x faster from 512 KiB).
constexpr size_t kPipelineMinBytes = 256 << 10;

size_t shm_data_bytes() { return static_cast<size_t>(kShmBytes.get()); }
size_t p2p_channel_bytes() { return static_cast<size_t>(kP2PChannelBytes.get()); }

std::string describe(const OpHeader& h) {
  std::string s = str(op_name(static_cast<OpCode>(h.op)), " #", h.seq);
  const auto op = static_cast<OpCode>(h.op);
  if (op == OpCode::Barrier) return s;
  s += str(" count=", h.count, " dtype=", dtype_name(static_cast<DType>(h.dtype)));
  if (op == OpCode::AllReduce || op == OpCode::Reduce || op == OpCode::ReduceScatter) {
    s += str(" op=", reduce_name(static_cast<ReduceKind>(h.reduce)));
  }
  if (op == OpCode::Reduce || op == OpCode::Broadcast || op == OpCode::Gather || op == OpCode::Scatter) {
    s += str(" root=", h.root);
  }
  s += str(" algo=", algo_name(static_cast<Algo>(h.algo)));
  return s;
}

OpHeader header(OpCode op, DType t, int64_t count, ReduceKind r = ReduceKind::Sum, int64_t root = 0,
                Algo algo = Algo::OneShot) {
  OpHeader h{};
  h.op = static_cast<int32_t>(op);
  h.dtype = static_cast<int32_t>(t);
  h.count = count;
  h.reduce = static_cast<int32_t>(r);
  h.root = root;
  h.algo = static_cast<int32_t>(algo);
  h.lanes = 1;
  return h;
}

}  // namespace

CpuEngine::PeerRead CpuEngine::parse_peer_read() {
  const std::string v = kPeerRead.get();
  if (v == "auto") return CpuEngine::PeerRead::Auto;
  if (v == "on") return CpuEngine::PeerRead::On;
  if (v == "off") return CpuEngine::PeerRead::Off;
  throw std::invalid_argument(str("pycoll: PYCOLL_CPU_PEER_READ=", v, " is not one of auto, on, off"));
}

bool CpuEngine::parse_shared_tensors() {
  const std::string v = kSharedTensors.get();
  if (v == "on") return true;
  if (v == "off") return false;
  throw std::invalid_argument(str("pycoll: PYCOLL_CPU_SHARED_TENSORS=", v, " is not one of on, off"));
}

CpuEngine::CpuEngine(Rendezvous rv, int rank, int size, std::chrono::milliseconds timeout)
    : rv_(std::move(rv)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      threads_(cpu_threads_per_rank(size)),
      shared_tensors_on_(parse_shared_tensors()),
      peer_read_mode_(parse_peer_read()),
      stream_min_bytes_(stream_store_min_bytes(size)) {}

CpuEngine::~CpuEngine() {
  abort_.store(true);
  p2p_.reset();  // joins the p2p threads before the transport goes away
  pool_.reset();
}

bool CpuEngine::pipelines(size_t bytes) const { return size_ > 1 && bytes >= kPipelineMinBytes; }

std::vector<int64_t> CpuEngine::header_addrs() const {
  std::vector<int64_t> addrs(size_);
  for (int r = 0; r < size_; ++r) addrs[r] = header_of(r).addr;
  return addrs;
}

int CpuEngine::offered_threads() const {
  int offered = threads_;
  for (int r = 0; r < size_; ++r) {
    offered = std::min<int>(offered, static_cast<int>(header_of(r).lanes));
  }
  return offered;
}

Pipeline CpuEngine::pipeline(Waiter& w, size_t bytes, size_t streamed_out_bytes) {
  const int lanes = pipeline_lanes(bytes, size_, offered_threads());
  if (lanes > 1 && (!pool_ || pool_->workers() < lanes - 1)) pool_ = std::make_unique<LanePool>(threads_ - 1);
  last_lanes_ = lanes;
  const bool stream_out = streamed_out_bytes > 0 && streamed_out_bytes >= stream_min_bytes_;
  return Pipeline{*transport_, w, lane_step_.data(), lanes, pool_.get(), stream_out};
}

bool CpuEngine::reads_in_place(CpuContext& c, OpCode op, size_t bytes) {
  // Every rank decides from the same headers: the least mode any rank set, so none waits for a probe
  // or a peer's reads that another skips.
  PeerRead mode = peer_read_mode_;
  for (int r = 0; r < size_; ++r) mode = std::min(mode, static_cast<PeerRead>(header_of(r).peer_read));
  if (mode == PeerRead::Off || peer_read_allowed_ == PeerReadAllowed::No) return false;
  if (mode == PeerRead::Auto && !auto_reads_in_place(op, bytes, size_, offered_threads())) return false;
  if (peer_read_allowed_ == PeerReadAllowed::Unknown) {
    int err = 0, failed = -1;
    for (int r = 0; r < size_ && failed < 0; ++r) {
      const auto* addr = reinterpret_cast<const void*>(header_of(r).addr);
      if (r != rank_ && !can_read_peer(transport_->control(r).pid, addr, &err)) failed = r;
    }
    const Vote v = vote(c, &ControlBlock::peer_read_probe, failed < 0 ? 1 : 2);  // 2: may not read
    peer_read_allowed_ = v.worst == 1 ? PeerReadAllowed::Yes : PeerReadAllowed::No;
    if (v.worst != 1 && debug_info_enabled()) {
      const std::string why = failed >= 0 ? str("reading rank ", failed, " failed: ", std::strerror(err))
                                          : str("rank ", v.worst_rank, " may not read its peers");
      std::fprintf(stderr,
                   "[pycoll %d/%d] cross-memory attach (process_vm_readv) is not allowed (%s): large CPU "
                   "all_gather, reduce_scatter and broadcast stage through shared memory\n",
                   rank_, size_, why.c_str());
    }
  }
  return peer_read_allowed_ == PeerReadAllowed::Yes;
}

CpuEngine::Vote CpuEngine::vote(CpuContext& c, Counter ControlBlock::* slot, uint64_t code) {
  // seq * 8 + code: counters only grow, so an older op's vote never reads as this one's.
  (transport_->control(rank_).*slot).value.store(seq_ * 8 + code, std::memory_order_release);
  Vote v{code, rank_};
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const std::atomic<uint64_t>& theirs = (transport_->control(r).*slot).value;
    c.w.until_ge(r, theirs, seq_ * 8 + 1, "peers' votes");
    const uint64_t code_r = theirs.load(std::memory_order_acquire) - seq_ * 8;
    if (code_r > v.worst) v = {code_r, r};
  }
  return v;
}

bool CpuEngine::worth_reading_shared(OpCode op, size_t bytes) const {
  if (pipeline_lanes(bytes, size_, offered_threads()) > 1) return true;
  if (op == OpCode::AllGather) return bytes < kSharedOneLaneAllGatherMaxBytes;
  if (op == OpCode::Broadcast) return bytes < kSharedOneLaneBroadcastMaxBytes;
  return true;
}

std::optional<CpuEngine::SharedBuffers> CpuEngine::shared_buffers(CpuContext& c, OpCode op, int root, const char* in,
                                                                  size_t in_bytes, char* out, size_t out_bytes) {
  // Every rank must be willing, or a rank whose setting differs would skip the vote the others wait in.
  if (shared_open_ == SharedOpen::No) return std::nullopt;
  for (int r = 0; r < size_; ++r) {
    if (header_of(r).reads_shared != 1) return std::nullopt;
  }
  // Every buffer a peer reads or writes, and who maps it; decided from the headers alone, so every
  // rank decides the same. Broadcast: every rank reads the root's buffer, and the root writes the
  // others' where all are shared and the op has few lanes (shared_broadcast), else the others read
  // all of it. all_reduce: every rank writes every output and reads every input (the writes first,
  // so that an in-place buffer is mapped once, writable, and its read finds that mapping).
  constexpr int every = PeerBuffer::kEvery, nobody = PeerBuffer::kNobody;
  bool root_writes =
      op == OpCode::Broadcast && pipeline_lanes(in_bytes, size_, offered_threads()) <= kBroadcastRootWritesMaxLanes;
  for (int r = 0; r < size_ && root_writes; ++r) root_writes = header_of(r).shared_in.valid();
  std::vector<PeerBuffer> uses;
  for (int r = 0; r < size_; ++r) {
    const OpHeader& h = header_of(r);
    if (op == OpCode::Broadcast) {
      if (r == root) {
        uses.push_back({r, &h.shared_in, in_bytes, every, false});
      } else if (root_writes) {
        uses.push_back({r, &h.shared_in, in_bytes, root, true});
      } else if (h.shared_in.valid()) {
        uses.push_back({r, &h.shared_in, in_bytes, nobody, false});  // for the overlap check alone
      }
    } else {
      if (op == OpCode::AllReduce) uses.push_back({r, &h.shared_out, out_bytes, every, true});
      uses.push_back({r, &h.shared_in, in_bytes, every, false});
    }
  }
  for (const PeerBuffer& a : uses) {
    if (!a.ref->valid()) return std::nullopt;
    // Two ranks passing the same memory (one tensor shared with both) would write what the other
    // reads: those stage, as they did before.
    for (const PeerBuffer& b : uses) {
      if (a.rank < b.rank && a.ref->dev == b.ref->dev && a.ref->ino == b.ref->ino &&
          a.ref->offset < b.ref->offset + static_cast<int64_t>(b.bytes) &&
          b.ref->offset < a.ref->offset + static_cast<int64_t>(a.bytes)) {
        return std::nullopt;
      }
    }
  }
  SharedBuffers bufs{std::vector<const char*>(size_, nullptr), std::vector<char*>(size_, nullptr), root_writes};
  bufs.in[rank_] = in;
  bufs.out[rank_] = out;
  const auto mine_to_map = [&](const PeerBuffer& a) {
    return a.rank != rank_ && (a.mapper == every || a.mapper == rank_);
  };
  const auto store = [&](const PeerBuffer& a, char* p) {
    if (a.write) {
      bufs.out[a.rank] = p;
    } else {
      bufs.in[a.rank] = p;
    }
  };
  const auto agreed = [&](const PeerBuffer& a) {
    if (a.mapper == nobody) return true;
    return std::any_of(agreed_files_.begin(), agreed_files_.end(), [&](const AgreedFile& f) {
      return f.rank == a.rank && f.dev == a.ref->dev && f.ino == a.ref->ino && f.bytes == a.ref->file_bytes &&
             (f.mapper == every || f.mapper == a.mapper) && (f.writable || !a.write);
    });
  };
  // Every file this op uses was mapped by every rank that maps it at an earlier vote, and no rank
  // has evicted a mapping since (evicting takes a miss, and a miss takes a vote): all are cached
  // where they are needed.
  if (std::all_of(uses.begin(), uses.end(), agreed)) {
    for (const PeerBuffer& a : uses) {
      if (!mine_to_map(a)) continue;
      char* p = peer_files_.cached(a.rank, *a.ref, a.write);
      if (p == nullptr) {
        throw GroupBroken(str("pycoll: op #", seq_, ": rank ", a.rank,
                              "'s shared-memory tensor is not mapped here "
                              "although every rank agreed it was (a bug in pycollectives)"));
      }
      store(a, p);
    }
    return bufs;
  }
  // My vote: 1 mapped everything; 2 mapped everything, evicting an older mapping; 3 not allowed;
  // 4 failed otherwise.
  uint64_t mine = 1;
  int err = 0, failed_peer = -1;
  peer_files_.begin_op();
  for (const PeerBuffer& a : uses) {
    if (!mine_to_map(a) || mine > 2) continue;
    bool evicted = false;
    char* p = peer_files_.map(a.rank, transport_->control(a.rank).pid, *a.ref, a.write, &err, &evicted);
    store(a, p);
    if (p == nullptr) {
      mine = PeerFileMaps::lasting(err) ? 3 : 4;
      failed_peer = a.rank;
    } else if (evicted) {
      mine = 2;
    }
  }
  test_hooks::count_shared_vote();
  const Vote v = vote(c, &ControlBlock::shared_vote, mine);
  const uint64_t worst = v.worst;
  const int worst_rank = v.worst_rank;
  // Every rank saw the same votes, so every rank updates what it knows alike.
  if (worst == 3) {
    shared_open_ = SharedOpen::No;
    if (debug_info_enabled()) {
      const std::string why = mine == 3 ? str("opening rank ", failed_peer, "'s file failed: ", std::strerror(err))
                                        : str("rank ", worst_rank, " may not open its peers' files");
      std::fprintf(stderr,
                   "[pycoll %d/%d] peers' shared-memory tensors cannot be mapped (%s): large CPU collectives "
                   "stage them through shared memory\n",
                   rank_, size_, why.c_str());
    }
  }
  if (worst > 2) {
    agreed_files_.clear();
    if (worst == 4 && debug_info_enabled()) {
      const bool mine = worst_rank == rank_;
      std::fprintf(stderr,
                   "[pycoll %d/%d] op #%llu: rank %d could not map a peer's shared-memory tensor%s%s; the op "
                   "stages\n",
                   rank_, size_, static_cast<unsigned long long>(seq_), worst_rank, mine ? ": " : "",
                   mine ? std::strerror(err) : "");
    }
    return std::nullopt;
  }
  if (worst == 2) agreed_files_.clear();  // some rank let go of a file it had agreed to hold
  for (const PeerBuffer& a : uses) {
    if (a.mapper != nobody && !agreed(a)) {
      agreed_files_.push_back({a.rank, a.ref->dev, a.ref->ino, a.ref->file_bytes, a.mapper, a.write});
    }
  }
  shared_open_ = SharedOpen::Yes;
  return bufs;
}

void CpuEngine::abort() { abort_.store(true); }

void CpuEngine::ensure_transport() {
  std::lock_guard<std::mutex> g(transport_mu_);
  if (transport_) return;
  transport_ = std::make_unique<ShmTransport>(rv_, rank_, size_, shm_data_bytes(), p2p_channel_bytes(), timeout_);
  p2p_ = std::make_unique<PointToPoint>(*transport_, timeout_, &abort_, shared_tensors_on_);
  // Before this rank's first op header, the earliest a peer may probe it (reads_in_place).
  if (may_ever_read_in_place()) {
    std::vector<int64_t> pids(size_);
    for (int r = 0; r < size_; ++r) pids[r] = transport_->control(r).pid;
    const PtracerDeclaration d = declare_ptracer_for(pids);
    if (!d.what.empty() && debug_info_enabled())
      std::fprintf(stderr, "[pycoll %d/%d] %s\n", rank_, size_, d.what.c_str());
  }
}

bool CpuEngine::may_ever_read_in_place() const {
  if (size_ < 2 || peer_read_mode_ == PeerRead::Off) return false;
  if (peer_read_mode_ == PeerRead::On) return true;
  constexpr size_t kAnySize = size_t(1) << 62;
  return auto_reads_in_place(OpCode::AllGather, kAnySize, size_, threads_) ||
         auto_reads_in_place(OpCode::ReduceScatter, kAnySize, size_, threads_);
}

PointToPoint& CpuEngine::p2p() {
  ensure_transport();
  return *p2p_;
}

Algo CpuEngine::resolve(OpCode op, Algo requested, size_t bytes) const {
  if (size_ == 1) return Algo::OneShot;
  if (requested != Algo::Auto && algorithm_available(op, requested)) {
    // Two-shot is the direct reduce-scatter; one-shot the direct all-gather.
    if (op == OpCode::AllGather && requested == Algo::TwoShot) return Algo::OneShot;
    if (op == OpCode::ReduceScatter && requested == Algo::OneShot) return Algo::TwoShot;
    if ((op == OpCode::Broadcast || op == OpCode::Reduce) && requested == Algo::TwoShot) return Algo::OneShot;
    return requested;
  }
  return select_algorithm(op, bytes, size_);
}

Waiter CpuEngine::waiter(OpCode op) {
  if (abort_.load()) throw GroupBroken("pycoll: the group was aborted");
  ensure_transport();
  return Waiter(*transport_, timeout_, &abort_, str("pycoll::", op_name(op), " (op #", seq_ + 1, ")"));
}

CpuContext CpuEngine::begin(OpHeader h, Waiter& w, const char* eager, size_t eager_bytes) {
  h.seq = ++seq_;
  h.lanes = threads_;
  h.reads_shared = shared_tensors_on_ ? 1 : 0;
  h.peer_read = static_cast<int64_t>(peer_read_mode_);
  last_lanes_ = 0;
  last_data_path_ = "pipelined";
  ControlBlock& mine = transport_->control(rank_);
  std::memcpy(&mine.header[h.seq & 1], &h, sizeof(OpHeader));
  CpuContext c{*transport_, w, barrier_epoch_, phase_, ring_step_, up_step_, down_step_};
  if (eager && eager_bytes > 0) std::memcpy(c.half(rank_), eager, eager_bytes);
  c.barrier();
  verify(h);
  return c;
}

void CpuEngine::verify(const OpHeader& mine) {
  const auto op = static_cast<OpCode>(mine.op);
  // A mismatch anywhere is seen by every rank: all of them threw above, in step.
  for (int a = 0; a < size_; ++a) {
    for (int b = a + 1; b < size_; ++b) {
      const OpHeader& ha = transport_->control(a).header[mine.seq & 1];
      const OpHeader& hb = transport_->control(b).header[mine.seq & 1];
      const bool same =
          ha.seq == hb.seq && ha.op == hb.op &&
          (op == OpCode::Barrier || (ha.dtype == hb.dtype && ha.reduce == hb.reduce && ha.root == hb.root &&
                                     ha.algo == hb.algo && (op == OpCode::AllToAll || ha.count == hb.count)));
      if (!same) {
        throw std::runtime_error(str("pycoll::", op_name(op), ": collective mismatch at op #", mine.seq, ": rank ", a,
                                     " called ", describe(ha), " but rank ", b, " called ", describe(hb)));
      }
      if (op == OpCode::AllToAll && (ha.split_bytes[b] != hb.recv_bytes[a] || hb.split_bytes[a] != ha.recv_bytes[b])) {
        const bool ab = ha.split_bytes[b] != hb.recv_bytes[a];
        const int s = ab ? a : b, d = ab ? b : a;
        const OpHeader& hs = ab ? ha : hb;
        const OpHeader& hd = ab ? hb : ha;
        throw std::runtime_error(str("pycoll::alltoall: split size mismatch at op #", mine.seq, ": rank ", s, " sends ",
                                     hs.split_bytes[d], " bytes to rank ", d, " but rank ", d, " expects ",
                                     hd.recv_bytes[s], " bytes from rank ", s));
      }
    }
  }
}

void CpuEngine::finish(CpuContext& c) {
  ++c.phase;
  c.barrier();
}

Algo CpuEngine::all_reduce(const char* in, char* out, int64_t count, DType t, ReduceKind op, Algo algo,
                           const SharedRefs& shared) {
  const size_t E = dtype_size(t);
  const size_t bytes = static_cast<size_t>(count) * E;
  const Algo a = resolve(OpCode::AllReduce, algo, bytes);
  Waiter w = waiter(OpCode::AllReduce);
  const ReduceSpec spec{t, op, size_};
  // Small one-shot ops publish their data together with the header: one barrier in all.
  const bool eager = a == Algo::OneShot && bytes <= (transport_->data_bytes() / 2 & ~size_t(63));
  OpHeader h = header(OpCode::AllReduce, t, count, op, 0, a);
  h.shared_in = shared.in;
  h.shared_out = shared.out;
  CpuContext c = begin(h, w, eager ? in : nullptr, eager ? bytes : 0);
  switch (a) {
    case Algo::OneShot: oneshot_all_reduce(c, spec, in, out, count, eager); break;
    case Algo::TwoShot: {
      // The two-shot is pipelined at every size it is chosen for (from ~32 KiB).
      std::optional<SharedBuffers> mapped;
      if (pipelines(bytes)) mapped = shared_buffers(c, OpCode::AllReduce, 0, in, bytes, out, bytes);
      Pipeline p = pipeline(w, bytes, 0);
      if (mapped) {
        last_data_path_ = "mapped in place";
        shared_all_reduce(p, spec, mapped->in, mapped->out, count);
        finish(c);  // inputs stay valid until read, outputs until every peer has written its slice
      } else {
        pipelined_all_reduce(p, spec, in, out, count);
      }
      break;
    }
    case Algo::Ring: ring_all_reduce(c, spec, in, out, count); break;
    case Algo::Tree: tree_all_reduce(c, spec, in, out, count); break;
    case Algo::Auto:
    case Algo::Direct:
    case Algo::Hierarchical:
    case Algo::Flat: break;  // resolve() never returns these for all_reduce
  }
  return a;
}

Algo CpuEngine::reduce(const char* in, char* out, int64_t count, DType t, ReduceKind op, int root, Algo algo) {
  const size_t bytes = static_cast<size_t>(count) * dtype_size(t);
  const Algo a = resolve(OpCode::Reduce, algo, bytes);
  Waiter w = waiter(OpCode::Reduce);
  const ReduceSpec spec{t, op, size_};
  CpuContext c = begin(header(OpCode::Reduce, t, count, op, root, a), w);
  if (a == Algo::Tree) {
    tree_reduce(c, spec, in, out, count, root);
    finish(c);
  } else {
    direct_reduce(c, spec, in, out, count, root);
  }
  return a;
}

Algo CpuEngine::broadcast(char* buf, int64_t count, DType t, int root, Algo algo, const SharedRefs& shared) {
  const size_t bytes = static_cast<size_t>(count) * dtype_size(t);
  const Algo a = resolve(OpCode::Broadcast, algo, bytes);
  Waiter w = waiter(OpCode::Broadcast);
  OpHeader h = header(OpCode::Broadcast, t, count, ReduceKind::Sum, root, a);
  h.addr = reinterpret_cast<int64_t>(buf);
  h.shared_in = shared.in;
  CpuContext c = begin(h, w);
  std::optional<SharedBuffers> mapped;
  if (a != Algo::Tree && pipelines(bytes) && worth_reading_shared(OpCode::Broadcast, bytes)) {
    mapped = shared_buffers(c, OpCode::Broadcast, root, buf, bytes, buf, bytes);
  }
  if (a == Algo::Tree) {
    tree_broadcast(c, t, buf, count, root);
    finish(c);
  } else if (mapped) {
    Pipeline p = pipeline(w, bytes, 0);
    last_data_path_ = "mapped in place";
    shared_broadcast(p, t, mapped->in[root], mapped->out, mapped->root_writes, count, root);
    finish(c);  // the root's buffer stays valid until every rank has read it, and its writes land
  } else if (pipelines(bytes) && reads_in_place(c, OpCode::Broadcast, bytes)) {
    Pipeline p = pipeline(w, bytes, 0);
    last_data_path_ = "read in place";
    peer_read_broadcast(p, header_addrs().data(), t, buf, count, root);
    finish(c);  // the root's buffer stays valid until every rank has read it
  } else if (pipelines(bytes)) {
    Pipeline p = pipeline(w, bytes, 0);
    pipelined_broadcast(p, t, buf, count, root);
  } else {
    direct_broadcast(c, t, buf, count, root);
  }
  return a;
}

Algo CpuEngine::all_gather(const char* in, char* out, int64_t m, DType t, Algo algo, const SharedRefs& shared) {
  const size_t bytes = static_cast<size_t>(m) * dtype_size(t) * size_;
  const Algo a = resolve(OpCode::AllGather, algo, bytes);
  Waiter w = waiter(OpCode::AllGather);
  OpHeader h = header(OpCode::AllGather, t, m, ReduceKind::Sum, 0, a);
  h.addr = reinterpret_cast<int64_t>(in);
  h.shared_in = shared.in;
  CpuContext c = begin(h, w);
  const size_t in_bytes = static_cast<size_t>(m) * dtype_size(t);
  std::optional<SharedBuffers> mapped;
  if (a != Algo::Ring && pipelines(bytes) && worth_reading_shared(OpCode::AllGather, bytes)) {
    mapped = shared_buffers(c, OpCode::AllGather, 0, in, in_bytes, out, bytes);
  }
  if (a == Algo::Ring) {
    ring_all_gather(c, t, in, out, m);
  } else if (mapped) {
    Pipeline p = pipeline(w, bytes, bytes);
    last_data_path_ = "mapped in place";
    shared_all_gather(p, t, mapped->in, out, m);
    finish(c);  // every rank's input stays valid until every peer has read it
  } else if (pipelines(bytes) && reads_in_place(c, OpCode::AllGather, bytes)) {
    Pipeline p = pipeline(w, bytes, bytes);
    last_data_path_ = "read in place";
    peer_read_all_gather(p, header_addrs().data(), t, in, out, m);
    finish(c);  // every rank's input stays valid until every peer has read it
  } else if (pipelines(bytes)) {
    Pipeline p = pipeline(w, bytes, bytes);
    pipelined_all_gather(p, t, in, out, m);
  } else {
    direct_all_gather(c, t, in, out, m);
  }
  return a;
}

Algo CpuEngine::reduce_scatter(const char* in, char* out, int64_t m, DType t, ReduceKind op, Algo algo,
                               const SharedRefs& shared) {
  const size_t bytes = static_cast<size_t>(m) * dtype_size(t) * size_;
  const Algo a = resolve(OpCode::ReduceScatter, algo, bytes);
  Waiter w = waiter(OpCode::ReduceScatter);
  const ReduceSpec spec{t, op, size_};
  OpHeader h = header(OpCode::ReduceScatter, t, m, op, 0, a);
  h.addr = reinterpret_cast<int64_t>(in);
  h.shared_in = shared.in;
  CpuContext c = begin(h, w);
  std::optional<SharedBuffers> mapped;
  if (a != Algo::Ring && pipelines(bytes)) {
    mapped = shared_buffers(c, OpCode::ReduceScatter, 0, in, bytes, out, bytes / size_);
  }
  if (a == Algo::Ring) {
    ring_reduce_scatter(c, spec, in, out, m);
  } else if (mapped) {
    Pipeline p = pipeline(w, bytes, 0);
    last_data_path_ = "mapped in place";
    shared_reduce_scatter(p, spec, mapped->in, out, m);
    finish(c);  // every rank's input stays valid until every peer has read it
  } else if (pipelines(bytes) && reads_in_place(c, OpCode::ReduceScatter, bytes)) {
    Pipeline p = pipeline(w, bytes, 0);
    last_data_path_ = "read in place";
    peer_read_reduce_scatter(p, spec, header_addrs().data(), in, out, m);
    finish(c);  // every rank's input stays valid until every peer has read it
  } else if (pipelines(bytes)) {
    Pipeline p = pipeline(w, bytes, 0);
    pipelined_reduce_scatter(p, spec, in, out, m);
  } else {
    direct_reduce_scatter(c, spec, in, out, m);
  }
  return a;
}

void CpuEngine::gather(const char* in, char* out, int64_t m, DType t, int root) {
  Waiter w = waiter(OpCode::Gather);
  CpuContext c = begin(header(OpCode::Gather, t, m, ReduceKind::Sum, root), w);
  direct_gather(c, t, in, out, m, root);
}

void CpuEngine::scatter(const char* in, char* out, int64_t m, DType t, int root) {
  Waiter w = waiter(OpCode::Scatter);
  CpuContext c = begin(header(OpCode::Scatter, t, m, ReduceKind::Sum, root), w);
  direct_scatter(c, t, in, out, m, root);
}

void CpuEngine::all_to_all(const char* in, char* out, const std::vector<int64_t>& send_bytes,
                           const std::vector<int64_t>& send_off, const std::vector<int64_t>& recv_bytes,
                           const std::vector<int64_t>& recv_off, DType t) {
  Waiter w = waiter(OpCode::AllToAll);
  OpHeader h = header(OpCode::AllToAll, t, 0);
  int64_t my_max = 0;
  for (int d = 0; d < size_; ++d) {
    h.split_bytes[d] = send_bytes[d];
    h.recv_bytes[d] = recv_bytes[d];
    my_max = std::max(my_max, send_bytes[d]);
  }
  h.aux = my_max;
  CpuContext c = begin(h, w);
  int64_t max_block = 0;
  for (int r = 0; r < size_; ++r) max_block = std::max(max_block, header_of(r).aux);
  direct_all_to_all(c, in, out, send_bytes, send_off, recv_bytes, recv_off, max_block);
}

void CpuEngine::barrier() {
  Waiter w = waiter(OpCode::Barrier);
  begin(header(OpCode::Barrier, DType::UInt8, 0), w);
}

}  // namespace pycoll

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
#include "cpu/plan.h"
#include "cpu/ring.h"
#include "cpu/schedule_run.h"
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

// Their help texts quote the plan's thresholds (cpu/plan.h), so they are built from its constants.
const std::string kPeerReadHelp = peer_read_setting_help();
const TextSetting kPeerRead("PYCOLL_CPU_PEER_READ", "auto", "auto, on, off", "cpu engine", false, Audience::User,
                            kPeerReadHelp.c_str());
const std::string kSharedTensorsHelp = shared_tensors_setting_help();
const TextSetting kSharedTensors("PYCOLL_CPU_SHARED_TENSORS", "on", "on, off", "cpu engine", true, Audience::User,
                                 kSharedTensorsHelp.c_str());

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
  if (static_cast<Algo>(h.algo) == Algo::Schedule) {
    s += h.schedule_digest ? str(" (program digest ", std::hex, h.schedule_digest, ")") : " (no program)";
  }
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

PeerRead CpuEngine::parse_peer_read() {
  const std::string v = kPeerRead.get();
  if (v == "auto") return PeerRead::Auto;
  if (v == "on") return PeerRead::On;
  if (v == "off") return PeerRead::Off;
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

PeerRead CpuEngine::agreed_peer_read() const {
  // The least mode any rank set: every rank decides the same, so none waits for a probe or a
  // peer's reads that another skips.
  PeerRead mode = peer_read_mode_;
  for (int r = 0; r < size_; ++r) mode = std::min(mode, static_cast<PeerRead>(header_of(r).peer_read));
  return mode;
}

CpuMemory CpuEngine::memory_of(OpCode op, int root) const {
  // Every rank must be willing, or a rank whose setting differs would skip the vote the others wait in.
  if (shared_open_ == SharedOpen::No) return CpuMemory::Private;
  bool every = true;
  for (int r = 0; r < size_; ++r) {
    const OpHeader& h = header_of(r);
    if (h.reads_shared != 1) return CpuMemory::Private;
    const bool shared = h.shared_in.valid() && (op != OpCode::AllReduce || h.shared_out.valid());
    if (!shared && op != OpCode::Broadcast) return CpuMemory::Private;
    every = every && shared;
  }
  if (op == OpCode::Broadcast && !header_of(root).shared_in.valid()) return CpuMemory::Private;
  return every ? CpuMemory::SharedEvery : CpuMemory::Shared;
}

Pipeline CpuEngine::pipeline(Waiter& w, const CpuPlan& p) {
  if (p.lanes > 1 && (!pool_ || pool_->workers() < p.lanes - 1)) pool_ = std::make_unique<LanePool>(threads_ - 1);
  return Pipeline{*transport_, w, lane_step_.data(), p.lanes, pool_.get(), p.stream_out};
}

void CpuEngine::probe_peer_read(CpuContext& c) {
  int err = 0, failed = -1;
  for (int r = 0; r < size_ && failed < 0; ++r) {
    const auto* addr = reinterpret_cast<const void*>(header_of(r).addr);
    if (r != rank_ && !can_read_peer(transport_->control(r).pid, addr, &err)) failed = r;
  }
  const Vote v = vote(c, &ControlBlock::peer_read_probe, failed < 0 ? 1 : 2);  // 2: may not read
  peer_read_probe_ = v.worst == 1 ? PeerReadProbe::Allowed : PeerReadProbe::Denied;
  if (v.worst != 1 && debug_info_enabled()) {
    const std::string why = failed >= 0 ? str("reading rank ", failed, " failed: ", std::strerror(err))
                                        : str("rank ", v.worst_rank, " may not read its peers");
    std::fprintf(stderr,
                 "[pycoll %d/%d] cross-memory attach (process_vm_readv) is not allowed (%s): large CPU "
                 "all_gather, reduce_scatter and broadcast stage through shared memory\n",
                 rank_, size_, why.c_str());
  }
}

CpuOpFacts CpuEngine::facts(OpCode op, int64_t count, DType t, Algo requested) const {
  // What agree() adds comes from the headers; until then the plan is good for its algorithm and eagerness.
  CpuOpFacts f{op, count, t, size_, requested, transport_->data_bytes()};
  f.stream_min_bytes = stream_min_bytes_;  // this rank's
  return f;
}

CpuPlan CpuEngine::agree(CpuContext& c, CpuOpFacts f, const CpuPlan& mine, int root, const char* in, size_t in_bytes,
                         char* out, size_t out_bytes, std::optional<SharedBuffers>& mapped) {
  // An op that runs a direct form at its size (or the eager one-shot) depends on nothing the peers'
  // headers add (plan_cpu_op reads the group's facts only for the pipelined forms): its own plan is
  // the group's, and the peers' header lines, written by other cores, stay unread.
  if (mine.path == CpuPath::Direct || mine.path == CpuPath::Eager) {
    last_plan_ = mine;
    return mine;
  }
  // Every input from the headers and the group's votes: every rank plans the same.
  f.requested = mine.algo;  // the algorithm every rank's header carries (verified alike)
  f.threads = offered_threads();
  f.memory = memory_of(f.op, root);
  f.peer_read = agreed_peer_read();
  f.probe = peer_read_probe_;
  CpuPlan p = plan_cpu_op(f);
  if (p.path == CpuPath::Mapped) {
    mapped = shared_buffers(c, p, root, in, in_bytes, out, out_bytes);
    if (!mapped) {
      f.memory = CpuMemory::Private;
      p = plan_cpu_op(f);
    }
  }
  if (p.probe_first) {
    probe_peer_read(c);
    f.probe = peer_read_probe_;
    p = plan_cpu_op(f);
  }
  last_plan_ = p;
  return p;
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

std::optional<CpuEngine::SharedBuffers> CpuEngine::shared_buffers(CpuContext& c, const CpuPlan& p, int root,
                                                                  const char* in, size_t in_bytes, char* out,
                                                                  size_t out_bytes) {
  // Every buffer a peer reads or writes, and who maps it; decided from the headers and the plan
  // alone, so every rank decides the same. Broadcast: every rank reads the root's buffer, and the
  // root writes the others' where the plan says so (shared_broadcast), else the others read all of
  // it. all_reduce: every rank writes every output and reads every input (the writes first, so
  // that an in-place buffer is mapped once, writable, and its read finds that mapping).
  constexpr int every = PeerBuffer::kEvery, nobody = PeerBuffer::kNobody;
  const OpCode op = p.op;
  const bool root_writes = p.root_writes;
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
  SharedBuffers bufs{std::vector<const char*>(size_, nullptr), std::vector<char*>(size_, nullptr)};
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
  if (transport_ready_.load(std::memory_order_acquire)) return;  // every op asks: no lock once made
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
  transport_ready_.store(true, std::memory_order_release);
}

bool CpuEngine::may_ever_read_in_place() const {
  return pycoll::may_ever_read_in_place(peer_read_mode_, size_, threads_);
}

PointToPoint& CpuEngine::p2p() {
  ensure_transport();
  return *p2p_;
}

Waiter CpuEngine::waiter(OpCode op) {
  if (abort_.load()) throw GroupBroken("pycoll: the group was aborted");
  ensure_transport();
  return Waiter(*transport_, timeout_, &abort_, op_name(op), seq_ + 1);
}

CpuContext CpuEngine::begin(const OpHeader& h, Waiter& w, const char* eager, size_t eager_bytes,
                            const AllToAllSplits* splits, std::optional<Algo> algo) {
  const uint64_t seq = ++seq_;
  last_plan_.reset();
  ControlBlock& ctl = transport_->control(rank_);
  // Written where the peers read it (a header is a few lines; the caller's copy stays as built).
  OpHeader& mine = ctl.header[seq & 1];
  mine = h;
  mine.seq = seq;
  mine.lanes = threads_;
  mine.reads_shared = shared_tensors_on_ ? 1 : 0;
  mine.peer_read = static_cast<int64_t>(peer_read_mode_);
  if (algo) mine.algo = static_cast<int32_t>(*algo);
  if (splits != nullptr) ctl.splits[seq & 1] = *splits;
  CpuContext c{*transport_, w, barrier_epoch_, phase_, ring_step_, up_step_, down_step_};
  if (eager && eager_bytes > 0) std::memcpy(c.half(rank_), eager, eager_bytes);
  c.barrier();
  verify(mine);
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
          (op == OpCode::Barrier ||
           (ha.dtype == hb.dtype && ha.reduce == hb.reduce && ha.root == hb.root && ha.algo == hb.algo &&
            ha.schedule_digest == hb.schedule_digest && (op == OpCode::AllToAll || ha.count == hb.count)));
      if (!same) {
        throw std::runtime_error(str("pycoll::", op_name(op), ": collective mismatch at op #", mine.seq, ": rank ", a,
                                     " called ", describe(ha), " but rank ", b, " called ", describe(hb)));
      }
      if (op != OpCode::AllToAll) continue;
      const AllToAllSplits& sa = transport_->control(a).splits[mine.seq & 1];
      const AllToAllSplits& sb = transport_->control(b).splits[mine.seq & 1];
      if (sa.send_bytes[b] != sb.recv_bytes[a] || sb.send_bytes[a] != sa.recv_bytes[b]) {
        const bool ab = sa.send_bytes[b] != sb.recv_bytes[a];
        const int s = ab ? a : b, d = ab ? b : a;
        const AllToAllSplits& ss = ab ? sa : sb;
        const AllToAllSplits& sd = ab ? sb : sa;
        throw std::runtime_error(str("pycoll::alltoall: split size mismatch at op #", mine.seq, ": rank ", s, " sends ",
                                     ss.send_bytes[d], " bytes to rank ", d, " but rank ", d, " expects ",
                                     sd.recv_bytes[s], " bytes from rank ", s));
      }
    }
  }
}

void CpuEngine::finish(CpuContext& c) {
  ++c.phase;
  c.barrier();
}

CpuEngine::Begun CpuEngine::start(const OpHeader& h, Waiter& w, const CpuOpFacts& f, int root, const char* in,
                                  size_t in_bytes, char* out, size_t out_bytes) {
  const CpuPlan mine = plan_cpu_op(f);
  const bool eager = mine.path == CpuPath::Eager;  // the input goes with the header
  Begun b{begin(h, w, eager ? in : nullptr, eager ? mine.bytes : 0, nullptr, mine.algo), mine, std::nullopt};
  b.plan = agree(b.c, f, mine, root, in, in_bytes, out, out_bytes, b.mapped);
  return b;
}

template <typename Direct, typename Staged, typename Mapped, typename Read>
void CpuEngine::execute(Begun& b, Waiter& w, Direct&& direct, Staged&& staged, Mapped&& mapped, Read&& read) {
  Pipeline pl = pipeline(w, b.plan);
  switch (b.plan.path) {
    case CpuPath::Eager:
    case CpuPath::Direct: direct(); break;
    case CpuPath::Pipelined: staged(pl); break;
    case CpuPath::Mapped:
      mapped(pl, *b.mapped);
      finish(b.c);  // every rank's buffers stay valid until every peer has read (or written) them
      break;
    case CpuPath::ReadInPlace:
      read(pl, header_addrs().data());
      finish(b.c);  // every rank's buffer stays valid until every peer has read it
      break;
  }
}

Algo CpuEngine::all_reduce(const char* in, char* out, int64_t count, DType t, ReduceKind op, Algo algo,
                           const SharedRefs& shared) {
  Waiter w = waiter(OpCode::AllReduce);
  OpHeader h = header(OpCode::AllReduce, t, count, op);
  h.shared_in = shared.in;
  h.shared_out = shared.out;
  const size_t bytes = static_cast<size_t>(count) * dtype_size(t);
  Begun b = start(h, w, facts(OpCode::AllReduce, count, t, algo), 0, in, bytes, out, bytes);
  const ReduceSpec spec{t, op, size_};
  execute(
      b, w,
      [&] {
        if (b.plan.algo == Algo::Ring) {
          ring_all_reduce(b.c, spec, in, out, count);
        } else if (b.plan.algo == Algo::Tree) {
          tree_all_reduce(b.c, spec, in, out, count);
        } else {
          oneshot_all_reduce(b.c, spec, in, out, count, b.plan.path == CpuPath::Eager);
        }
      },
      [&](Pipeline& pl) { pipelined_all_reduce(pl, spec, in, out, count); },
      [&](Pipeline& pl, const SharedBuffers& s) { shared_all_reduce(pl, spec, s.in, s.out, count); },
      [](Pipeline&, const int64_t*) {});  // never planned for all_reduce
  return b.plan.algo;
}

Algo CpuEngine::reduce(const char* in, char* out, int64_t count, DType t, ReduceKind op, int root, Algo algo) {
  Waiter w = waiter(OpCode::Reduce);
  Begun b =
      start(header(OpCode::Reduce, t, count, op, root), w, facts(OpCode::Reduce, count, t, algo), root, in, 0, out, 0);
  const ReduceSpec spec{t, op, size_};
  if (b.plan.algo == Algo::Tree) {  // reduce has no other path than its direct form
    tree_reduce(b.c, spec, in, out, count, root);
    finish(b.c);
  } else {
    direct_reduce(b.c, spec, in, out, count, root);
  }
  return b.plan.algo;
}

Algo CpuEngine::broadcast(char* buf, int64_t count, DType t, int root, Algo algo, const SharedRefs& shared) {
  Waiter w = waiter(OpCode::Broadcast);
  OpHeader h = header(OpCode::Broadcast, t, count, ReduceKind::Sum, root);
  h.addr = reinterpret_cast<int64_t>(buf);
  h.shared_in = shared.in;
  const size_t bytes = static_cast<size_t>(count) * dtype_size(t);
  Begun b = start(h, w, facts(OpCode::Broadcast, count, t, algo), root, buf, bytes, buf, bytes);
  execute(
      b, w,
      [&] {
        if (b.plan.algo == Algo::Tree) {
          tree_broadcast(b.c, t, buf, count, root);
          finish(b.c);
        } else {
          direct_broadcast(b.c, t, buf, count, root);
        }
      },
      [&](Pipeline& pl) { pipelined_broadcast(pl, t, buf, count, root); },
      [&](Pipeline& pl, const SharedBuffers& s) {
        shared_broadcast(pl, t, s.in[root], s.out, b.plan.root_writes, count, root);
      },
      [&](Pipeline& pl, const int64_t* addrs) { peer_read_broadcast(pl, addrs, t, buf, count, root); });
  return b.plan.algo;
}

Algo CpuEngine::all_gather(const char* in, char* out, int64_t m, DType t, Algo algo, const SharedRefs& shared) {
  Waiter w = waiter(OpCode::AllGather);
  OpHeader h = header(OpCode::AllGather, t, m);
  h.addr = reinterpret_cast<int64_t>(in);
  h.shared_in = shared.in;
  const size_t in_bytes = static_cast<size_t>(m) * dtype_size(t);
  Begun b = start(h, w, facts(OpCode::AllGather, m, t, algo), 0, in, in_bytes, out, in_bytes * size_);
  execute(
      b, w,
      [&] { b.plan.algo == Algo::Ring ? ring_all_gather(b.c, t, in, out, m) : direct_all_gather(b.c, t, in, out, m); },
      [&](Pipeline& pl) { pipelined_all_gather(pl, t, in, out, m); },
      [&](Pipeline& pl, const SharedBuffers& s) { shared_all_gather(pl, t, s.in, out, m); },
      [&](Pipeline& pl, const int64_t* addrs) { peer_read_all_gather(pl, addrs, t, in, out, m); });
  return b.plan.algo;
}

Algo CpuEngine::reduce_scatter(const char* in, char* out, int64_t m, DType t, ReduceKind op, Algo algo,
                               const SharedRefs& shared) {
  Waiter w = waiter(OpCode::ReduceScatter);
  OpHeader h = header(OpCode::ReduceScatter, t, m, op);
  h.addr = reinterpret_cast<int64_t>(in);
  h.shared_in = shared.in;
  const size_t out_bytes = static_cast<size_t>(m) * dtype_size(t);
  Begun b = start(h, w, facts(OpCode::ReduceScatter, m, t, algo), 0, in, out_bytes * size_, out, out_bytes);
  const ReduceSpec spec{t, op, size_};
  execute(
      b, w,
      [&] {
        b.plan.algo == Algo::Ring ? ring_reduce_scatter(b.c, spec, in, out, m)
                                  : direct_reduce_scatter(b.c, spec, in, out, m);
      },
      [&](Pipeline& pl) { pipelined_reduce_scatter(pl, spec, in, out, m); },
      [&](Pipeline& pl, const SharedBuffers& s) { shared_reduce_scatter(pl, spec, s.in, out, m); },
      [&](Pipeline& pl, const int64_t* addrs) { peer_read_reduce_scatter(pl, spec, addrs, in, out, m); });
  return b.plan.algo;
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

bool CpuEngine::run_schedule(const std::string& name, OpCode op, const char* in, char* out, int64_t block, DType t,
                             ReduceKind r, int root, bool uneven) {
  // Every rank takes part in the header exchange, even one whose program could not be had: the
  // digests then differ and every rank raises, instead of the others waiting for it.
  std::shared_ptr<const ScheduleProgram> prog;
  std::string failure;
  try {
    prog = schedule_program(name, op, size_);
    if (!prog) return false;
    if (uneven) {
      failure = str("pycoll::alltoall: schedule program '", name,
                    "' moves blocks of one size, but this rank's splits differ; use equal splits or another "
                    "algorithm");
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  Waiter w = waiter(op);
  OpHeader h = header(op, t, block, r, root, Algo::Schedule);
  h.schedule_digest = failure.empty() ? prog->digest : 0;
  std::optional<AllToAllSplits> splits;
  if (op == OpCode::AllToAll) {
    splits.emplace();
    for (int j = 0; j < size_; ++j) splits->send_bytes[j] = splits->recv_bytes[j] = uneven ? -1 : block;
  }
  std::optional<CpuContext> begun;
  try {
    begun.emplace(begin(h, w, nullptr, 0, splits ? &*splits : nullptr));
  } catch (const std::exception&) {
    if (!failure.empty()) throw std::invalid_argument(failure);
    throw;
  }
  if (!failure.empty()) throw std::invalid_argument(failure);
  CpuContext& c = *begun;
  const ScheduleProgram& p = *prog;
  const size_t E = dtype_size(t);
  const bool many_in = op == OpCode::ReduceScatter || op == OpCode::AllToAll;
  const bool many_out = op == OpCode::AllGather || op == OpCode::AllToAll;
  const size_t in_bytes = size_t(block) * E * (many_in ? size_ : 1);
  const size_t out_bytes = size_t(block) * E * (many_out ? size_ : 1);
  const bool rooted = op == OpCode::Broadcast || op == OpCode::Reduce;
  // A rooted op whose root is not the program's runs it with the ranks rotated.
  const int shift = rooted && p.root >= 0 ? ((root - p.root) % size_ + size_) % size_ : 0;

  CpuPlan plan;
  plan.op = op;
  plan.bytes = std::max(in_bytes, out_bytes);
  plan.algo = Algo::Schedule;
  plan.lanes = std::max(1, p.lanes);
  plan.schedule = name;
  last_plan_ = plan;

  // The buffers as the program expects them: aliased where it is in place, apart where it is not.
  char* pin = const_cast<char*>(in);
  char* pout = out;
  char* copy_back = nullptr;  // an in-place reduce_scatter run on a copy of the input: the output
  const auto copy_of = [](std::vector<char>& v, const char* from, size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    if (bytes) std::memcpy(v.data(), from, bytes);
    return v.data();
  };
  if (p.inplace) {
    if (op == OpCode::AllGather) {
      char* mine = pout + size_t(rank_) * block * E;
      if (pin != mine) std::memmove(mine, pin, size_t(block) * E);
      pin = mine;
    } else if (op == OpCode::ReduceScatter) {
      if (pout != pin + size_t(rank_) * block * E) {
        pin = copy_of(schedule_in_, in, in_bytes);
        copy_back = pout;
        pout = pin + size_t(rank_) * block * E;
      }
    } else if (pout == nullptr) {  // reduce off the root: its input stays as it was
      pin = pout = copy_of(schedule_out_, in, in_bytes);
    } else if (pin != pout) {
      std::memmove(pout, pin, in_bytes);
      pin = pout;
    }
  } else {
    if (pout == nullptr) {
      if (schedule_out_.size() < out_bytes) schedule_out_.resize(out_bytes);
      pout = schedule_out_.data();
    }
    if (pin < pout + out_bytes && pout < pin + in_bytes) pin = copy_of(schedule_in_, in, in_bytes);
  }

  if (p.lanes > 1 && (!schedule_pool_ || schedule_pool_->workers() + 1 < p.lanes)) {
    schedule_pool_ = std::make_unique<LanePool>(p.lanes - 1);
  }
  ScheduleRun run;
  run.program = &p;
  run.rank_shift = shift;
  run.me = ((rank_ - shift) % size_ + size_) % size_;
  run.block = block;
  run.spec = ReduceSpec{t, r == ReduceKind::Avg ? ReduceKind::Sum : r, size_};
  run.in = pin;
  run.out = pout;
  run.scratch = &schedule_scratch_;
  run.pool = schedule_pool_.get();
  execute_schedule(c, run, schedule_step_);

  const bool holds_result =
      op == OpCode::AllReduce || op == OpCode::ReduceScatter || (op == OpCode::Reduce && rank_ == root);
  if (r == ReduceKind::Avg && holds_result) {
    const Operand sum{pout, false};
    reduce_operands(ReduceSpec{t, ReduceKind::Avg, size_}, pout, false, &sum, 1, block, true);
  }
  if (copy_back) std::memcpy(copy_back, pout, size_t(block) * E);
  finish(c);
  return true;
}

void CpuEngine::all_to_all(const char* in, char* out, const std::vector<int64_t>& send_bytes,
                           const std::vector<int64_t>& send_off, const std::vector<int64_t>& recv_bytes,
                           const std::vector<int64_t>& recv_off, DType t) {
  Waiter w = waiter(OpCode::AllToAll);
  OpHeader h = header(OpCode::AllToAll, t, 0);
  AllToAllSplits splits;
  int64_t my_max = 0;
  for (int d = 0; d < size_; ++d) {
    splits.send_bytes[d] = send_bytes[d];
    splits.recv_bytes[d] = recv_bytes[d];
    my_max = std::max(my_max, send_bytes[d]);
  }
  h.aux = my_max;
  CpuContext c = begin(h, w, nullptr, 0, &splits);
  int64_t max_block = 0;
  for (int r = 0; r < size_; ++r) max_block = std::max(max_block, header_of(r).aux);
  direct_all_to_all(c, in, out, send_bytes, send_off, recv_bytes, recv_off, max_block);
}

void CpuEngine::barrier() {
  Waiter w = waiter(OpCode::Barrier);
  begin(header(OpCode::Barrier, DType::UInt8, 0), w);
}

}  // namespace pycoll

#include "algorithms/cpu_engine.h"

#include <cstring>
#include <stdexcept>

#include "algorithms/direct.h"
#include "algorithms/pipelined.h"
#include "algorithms/ring.h"
#include "algorithms/select.h"
#include "algorithms/tree.h"
#include "common/check.h"
#include "common/env.h"
#include "common/setting.h"
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
                                  Audience::User,
                                  "Shared memory per peer for the CPU engine's send/recv channel.", nullptr,
                                  /*bytes=*/true);

// Broadcast, all_gather and reduce_scatter run pipelined from this size (algorithms/pipelined.h);
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

CpuEngine::CpuEngine(Rendezvous rv, int rank, int size, std::chrono::milliseconds timeout)
    : rv_(std::move(rv)), rank_(rank), size_(size), timeout_(timeout), threads_(cpu_threads_per_rank(size)) {}

CpuEngine::~CpuEngine() {
  abort_.store(true);
  p2p_.reset();  // joins the p2p threads before the transport goes away
  pool_.reset();
}

bool CpuEngine::pipelines(size_t bytes) const { return size_ > 1 && bytes >= kPipelineMinBytes; }

Pipeline CpuEngine::pipeline(Waiter& w, size_t bytes) {
  int offered = threads_;
  for (int r = 0; r < size_; ++r) {
    offered = std::min<int>(offered, static_cast<int>(transport_->control(r).header[seq_ & 1].lanes));
  }
  const int lanes = pipeline_lanes(bytes, size_, offered);
  if (lanes > 1 && (!pool_ || pool_->workers() < lanes - 1)) pool_ = std::make_unique<LanePool>(threads_ - 1);
  last_lanes_ = lanes;
  return Pipeline{*transport_, w, lane_step_.data(), lanes, pool_.get()};
}

void CpuEngine::abort() { abort_.store(true); }

void CpuEngine::ensure_transport() {
  std::lock_guard<std::mutex> g(transport_mu_);
  if (transport_) return;
  transport_ = std::make_unique<ShmTransport>(rv_, rank_, size_, shm_data_bytes(), p2p_channel_bytes(), timeout_);
  p2p_ = std::make_unique<PointToPoint>(*transport_, timeout_, &abort_);
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
  last_lanes_ = 0;
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
      const bool same = ha.seq == hb.seq && ha.op == hb.op &&
                        (op == OpCode::Barrier ||
                         (ha.dtype == hb.dtype && ha.reduce == hb.reduce && ha.root == hb.root && ha.algo == hb.algo &&
                          (op == OpCode::AllToAll || ha.count == hb.count)));
      if (!same) {
        throw std::runtime_error(str("pycoll::", op_name(op), ": collective mismatch at op #", mine.seq, ": rank ", a,
                                     " called ", describe(ha), " but rank ", b, " called ", describe(hb)));
      }
      if (op == OpCode::AllToAll && (ha.split_bytes[b] != hb.recv_bytes[a] || hb.split_bytes[a] != ha.recv_bytes[b])) {
        const bool ab = ha.split_bytes[b] != hb.recv_bytes[a];
        const int s = ab ? a : b, d = ab ? b : a;
        const OpHeader& hs = ab ? ha : hb;
        const OpHeader& hd = ab ? hb : ha;
        throw std::runtime_error(str("pycoll::alltoall: split size mismatch at op #", mine.seq, ": rank ", s,
                                     " sends ", hs.split_bytes[d], " bytes to rank ", d, " but rank ", d,
                                     " expects ", hd.recv_bytes[s], " bytes from rank ", s));
      }
    }
  }
}

void CpuEngine::finish(CpuContext& c) {
  ++c.phase;
  c.barrier();
}

Algo CpuEngine::all_reduce(const char* in, char* out, int64_t count, DType t, ReduceKind op, Algo algo) {
  const size_t E = dtype_size(t);
  const size_t bytes = static_cast<size_t>(count) * E;
  const Algo a = resolve(OpCode::AllReduce, algo, bytes);
  Waiter w = waiter(OpCode::AllReduce);
  const ReduceSpec spec{t, op, size_};
  // Small one-shot ops publish their data together with the header: one barrier in all.
  const bool eager = a == Algo::OneShot && bytes <= (transport_->data_bytes() / 2 & ~size_t(63));
  CpuContext c = begin(header(OpCode::AllReduce, t, count, op, 0, a), w, eager ? in : nullptr, eager ? bytes : 0);
  switch (a) {
    case Algo::OneShot: oneshot_all_reduce(c, spec, in, out, count, eager); break;
    case Algo::TwoShot: {
      // The two-shot is pipelined at every size it is chosen for (from ~32 KiB).
      Pipeline p = pipeline(w, bytes);
      pipelined_all_reduce(p, spec, in, out, count);
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

Algo CpuEngine::broadcast(char* buf, int64_t count, DType t, int root, Algo algo) {
  const size_t bytes = static_cast<size_t>(count) * dtype_size(t);
  const Algo a = resolve(OpCode::Broadcast, algo, bytes);
  Waiter w = waiter(OpCode::Broadcast);
  CpuContext c = begin(header(OpCode::Broadcast, t, count, ReduceKind::Sum, root, a), w);
  if (a == Algo::Tree) {
    tree_broadcast(c, t, buf, count, root);
    finish(c);
  } else if (pipelines(bytes)) {
    Pipeline p = pipeline(w, bytes);
    pipelined_broadcast(p, t, buf, count, root);
  } else {
    direct_broadcast(c, t, buf, count, root);
  }
  return a;
}

Algo CpuEngine::all_gather(const char* in, char* out, int64_t m, DType t, Algo algo) {
  const size_t bytes = static_cast<size_t>(m) * dtype_size(t) * size_;
  const Algo a = resolve(OpCode::AllGather, algo, bytes);
  Waiter w = waiter(OpCode::AllGather);
  CpuContext c = begin(header(OpCode::AllGather, t, m, ReduceKind::Sum, 0, a), w);
  if (a == Algo::Ring) {
    ring_all_gather(c, t, in, out, m);
  } else if (pipelines(bytes)) {
    Pipeline p = pipeline(w, bytes);
    pipelined_all_gather(p, t, in, out, m);
  } else {
    direct_all_gather(c, t, in, out, m);
  }
  return a;
}

Algo CpuEngine::reduce_scatter(const char* in, char* out, int64_t m, DType t, ReduceKind op, Algo algo) {
  const size_t bytes = static_cast<size_t>(m) * dtype_size(t) * size_;
  const Algo a = resolve(OpCode::ReduceScatter, algo, bytes);
  Waiter w = waiter(OpCode::ReduceScatter);
  const ReduceSpec spec{t, op, size_};
  CpuContext c = begin(header(OpCode::ReduceScatter, t, m, op, 0, a), w);
  if (a == Algo::Ring) {
    ring_reduce_scatter(c, spec, in, out, m);
  } else if (pipelines(bytes)) {
    Pipeline p = pipeline(w, bytes);
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
  for (int r = 0; r < size_; ++r) max_block = std::max(max_block, transport_->control(r).header[seq_ & 1].aux);
  direct_all_to_all(c, in, out, send_bytes, send_off, recv_bytes, recv_off, max_block);
}

void CpuEngine::barrier() {
  Waiter w = waiter(OpCode::Barrier);
  begin(header(OpCode::Barrier, DType::UInt8, 0), w);
}

}  // namespace pycoll

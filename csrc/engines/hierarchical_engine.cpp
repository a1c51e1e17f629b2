#include "engines/hierarchical_engine.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/arith.h"
#include "common/setting.h"
#include "engines/call_check.h"
#include "engines/dtypes.h"
#include "engines/host_form_model.h"

namespace pycoll {

namespace {

// Off by default, as torch's own check of calls (TORCH_DISTRIBUTED_DEBUG=DETAIL, which turns
// this on too): the exchange is one more inter-host round trip per op, which can cost more than a
// small op itself. docs/decisions/0029-hierarchical-engine-sizes-and-call-costs.md
const IntSetting kCheckAcrossHosts(
    "PYCOLL_CHECK_ACROSS_HOSTS", 0, 0, 1, "backend", true, Audience::User,
    "1: across hosts, every op first compares the ranks' calls (one small all-gather between hosts, "
    "on Gloo), so that a call that differs raises an error naming both instead of aborting the "
    "process inside Gloo or hanging inside NCCL, at the price of that round trip per op (for CUDA "
    "tensors it blocks the calling thread, as torch's DETAIL mode does for NCCL).",
    "0 (1 with TORCH_DISTRIBUTED_DEBUG=DETAIL)");

bool check_calls_across_hosts() {
  const char* debug = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  return kCheckAcrossHosts.get_or(debug != nullptr && std::string(debug) == "DETAIL" ? 1 : 0) != 0;
}

c10d::ReduceOp to_c10d(ReduceKind k) {
  switch (k) {
    case ReduceKind::Sum:
    case ReduceKind::Avg: return c10d::ReduceOp::SUM;  // the caller divides once, at the end
    case ReduceKind::Product: return c10d::ReduceOp::PRODUCT;
    case ReduceKind::Min: return c10d::ReduceOp::MIN;
    case ReduceKind::Max: return c10d::ReduceOp::MAX;
    case ReduceKind::BAnd: return c10d::ReduceOp::BAND;
    case ReduceKind::BOr: return c10d::ReduceOp::BOR;
    case ReduceKind::BXor: return c10d::ReduceOp::BXOR;
    case ReduceKind::PremulSum: break;
  }
  TORCH_INTERNAL_ASSERT(false, "pycoll: PREMUL_SUM reaches engines as a pre-scale + SUM");
}

// Gloo does not reduce bool: it travels as uint8 0/1, where OR is MAX and AND is MIN.
ReduceKind bool_as_uint8(ReduceKind k) {
  switch (k) {
    case ReduceKind::Product:
    case ReduceKind::Min:
    case ReduceKind::BAnd: return ReduceKind::Min;
    case ReduceKind::BXor: return ReduceKind::BXor;
    default: return ReduceKind::Max;
  }
}

// What the inter-host backend reduces for t: Gloo has no bool, int16 or float8. bool travels as
// uint8 0/1 (OR is MAX, AND is MIN), int16 as int32 (the same result modulo 2^16), float8 as
// float32 (accumulated in float32, rounded once at the end).
std::pair<at::Tensor, ReduceKind> inter_host_form(const at::Tensor& t, ReduceKind op) {
  switch (t.scalar_type()) {
    case at::kBool: return {t.to(at::kByte), bool_as_uint8(op)};
    case at::kShort: return {t.to(at::kInt), op};
    case at::kFloat8_e4m3fn:
    case at::kFloat8_e5m2: return {t.to(at::kFloat), op};
    default: return {t, op};
  }
}

bool is_bitwise(ReduceKind k) { return k == ReduceKind::BAnd || k == ReduceKind::BOr || k == ReduceKind::BXor; }

// Every inter-host call runs on the current stream (asyncOp = false): pycoll has already put the
// op on the stream it runs on, and NCCL's own stream would add two cross-stream hops per call.
// Gloo ignores the flag.
template <class Options>
Options on_current_stream(Options o = Options()) {
  o.asyncOp = false;
  return o;
}

// Such a call may return no Work: NCCL has enqueued it on the current stream and there is
// nothing to wait for (torch's Python API checks the same).
void finish(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work) work->wait();
}

at::Tensor bytes_of(const at::Tensor& t) { return t.reshape({-1}).view(at::kByte); }

// Folds the rows of `rows` ([k, m], every member's values) into `out` (m elements), in member
// order, so every rank computes the same bits.
void fold_rows(const at::Tensor& rows, ReduceKind op, at::Tensor out) {
  out.copy_(rows[0]);
  for (int64_t i = 1; i < rows.size(0); ++i) {
    const at::Tensor& row = rows[i];
    switch (op) {
      case ReduceKind::Sum:
      case ReduceKind::Avg: out.add_(row); break;
      case ReduceKind::Product: out.mul_(row); break;
      case ReduceKind::Min: at::minimum_out(out, out, row); break;
      case ReduceKind::Max: at::maximum_out(out, out, row); break;
      case ReduceKind::BAnd: out.bitwise_and_(row); break;
      case ReduceKind::BOr: out.bitwise_or_(row); break;
      case ReduceKind::BXor: out.bitwise_xor_(row); break;
      case ReduceKind::PremulSum:
        TORCH_INTERNAL_ASSERT(false, "pycoll: PREMUL_SUM reaches engines as a pre-scale + SUM");
    }
  }
}

// NCCL reduces no bitwise op: gather every member's tensor and fold them here.
void gathered_all_reduce(const c10::intrusive_ptr<c10d::Backend>& b, const at::Tensor& t, ReduceKind op) {
  at::Tensor mine = t.reshape({-1}).contiguous();
  at::Tensor all = at::empty({b->getSize(), mine.numel()}, mine.options());
  finish(b->_allgather_base(all, mine, on_current_stream<c10d::AllgatherOptions>()));
  at::Tensor acc = at::empty_like(mine);
  fold_rows(all, op, acc);
  t.copy_(acc.view(t.sizes()));
}

// Runs an all_reduce of t (in place) on an inter-host backend; `nccl`: one without bitwise ops.
void backend_all_reduce(const c10::intrusive_ptr<c10d::Backend>& b, const at::Tensor& t, ReduceKind op, bool nccl) {
  auto [wire, wire_op] = inter_host_form(t, op);
  if (nccl && is_bitwise(wire_op)) {
    gathered_all_reduce(b, wire, wire_op);
    if (!wire.is_same(t)) t.copy_(wire);
    return;
  }
  std::vector<at::Tensor> ts{wire};
  auto opts = on_current_stream<c10d::AllreduceOptions>();
  opts.reduceOp = to_c10d(wire_op);
  finish(b->allreduce(ts, opts));
  if (!wire.is_same(t)) t.copy_(wire);
}

// A call started on an inter-host backend and not yet waited for: its result in wire form (a
// converted copy where the backend lacks the dtype) goes into `target` once it is done. Where
// `rows` is defined the call gathered every member's values there, and wait() folds them first.
struct StartedCall {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor wire, target;
  at::Tensor rows;
  ReduceKind fold = ReduceKind::Sum;
  void wait() {
    finish(work);
    if (rows.defined()) fold_rows(rows, fold, wire.view({-1}));
    if (!wire.is_same(target)) target.copy_(wire.view(target.sizes()));
  }
};

// An all_reduce of t (in place) on Gloo, started.
StartedCall start_gloo_all_reduce(c10d::Backend& b, const at::Tensor& t, ReduceKind op) {
  auto [wire, wire_op] = inter_host_form(t, op);
  std::vector<at::Tensor> ts{wire};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(wire_op);
  return {b.allreduce(ts, opts), wire, t};
}

// Reduce-scatter of `in` (k blocks of out.numel() elements, contiguous) among the k members of an
// inter-host backend: member i gets block i into `out`. Not for bitwise ops on NCCL.
// `as_gloo`: on Gloo, its reduce_scatter_tensor (an all_reduce of the whole, then this rank's
// block), which is what a user of Gloo gets. Otherwise, on Gloo (the rails of CPU tensors), an
// all-to-all of the blocks, which each member then folds: the (k-1)/k of the input that must
// cross hosts, sent directly; Gloo's own list-form reduce_scatter moves the same bytes but took
// 1.5-3.7x as long up to 4 MiB between 2 hosts (decision 0042).
StartedCall start_reduce_scatter(c10d::Backend& b, const at::Tensor& in, const at::Tensor& out, ReduceKind op,
                                 bool nccl, bool as_gloo) {
  auto [wire_in, wire_op] = inter_host_form(in, op);
  const bool direct = wire_in.scalar_type() == out.scalar_type() && out.is_contiguous();
  at::Tensor wire_out = direct ? out : at::empty({out.numel()}, wire_in.options());
  at::Tensor flat_out = wire_out.reshape({-1});
  auto opts = on_current_stream<c10d::ReduceScatterOptions>();
  opts.reduceOp = to_c10d(wire_op);
  if (nccl || as_gloo) return {b._reduce_scatter_base(flat_out, wire_in, opts), wire_out, out};
  at::Tensor rows = at::empty({b.getSize(), out.numel()}, wire_in.options());
  at::Tensor to = bytes_of(rows), from = bytes_of(wire_in);
  std::vector<int64_t> even;  // empty: equal splits
  auto work = b.alltoall_base(to, from, even, even, on_current_stream<c10d::AllToAllOptions>());
  return {work, wire_out, out, rows, wire_op};
}

void backend_reduce_scatter(c10d::Backend& b, const at::Tensor& in, const at::Tensor& out, ReduceKind op, bool nccl,
                            bool as_gloo) {
  start_reduce_scatter(b, in, out, op, nccl, as_gloo).wait();
}

// CPU tensors up to this size take the leader form of the hierarchical all_reduce: only the hosts'
// first ranks call Gloo, so the inter-host phase costs one Gloo call's CPU per host instead of one
// per rail; above it the three phases win. CUDA tensors keep the three phases (not measured).
// docs/decisions/0029-hierarchical-engine-sizes-and-call-costs.md
constexpr size_t kHostLeaderMaxBytes = 1 << 20;

// CPU tensors across links of at most 1 Gbit/s run the hierarchical all_reduce, reduce_scatter
// and all_gather in pieces, so that the host's phases of one piece run while the rail carries
// another. On faster links the host's phases and Gloo's threads compete for the cores instead, and
// one piece is faster. docs/decisions/0042-hierarchical-collectives-in-pieces.md
const IntSetting kHostPieceBytes(
    "PYCOLL_HOST_PIECE_BYTES", 0, 0, int64_t(1) << 40, "hierarchical engine", true, Audience::Developer,
    "CPU tensors across hosts: the hierarchical all_reduce, reduce_scatter or all_gather of at least 4 times "
    "this many bytes (the all_reduce's tensor, the reduce_scatter's input, the all_gather's output) runs in "
    "pieces of about this size (at most 8), the inter-host phase of each piece overlapping the host's phases "
    "of the pieces beside it; 0: in one piece. Read once per group.",
    "512K where PYCOLL_LINK is at most 1gbit, else 0", /*bytes=*/true);
constexpr int64_t kPiecedLinkMaxBps = 1000000000;
constexpr int64_t kPieceBytesOnSlowLinks = 512 << 10;
// Fewer pieces than this gain too little: with one more rail call per piece, a 1 MiB all_gather in
// 2 pieces met more of the simulated link's stalls than it saved (decision 0042).
constexpr int64_t kMinHostPieces = 4;
constexpr int64_t kMaxHostPieces = 8;

int64_t host_piece_bytes(int64_t link_bps) {
  const bool slow_link = link_bps > 0 && link_bps <= kPiecedLinkMaxBps;
  return kHostPieceBytes.get_or(slow_link ? kPieceBytesOnSlowLinks : 0);
}

// The CPU scratch buffer kept across calls grows to at most this; a larger op allocates its own
// (its page faults then cost a smaller share of its time, and a group keeps no more memory).
constexpr int64_t kKeptScratchMaxBytes = int64_t(128) << 20;

}  // namespace

HierarchicalEngine::HierarchicalEngine(Engine& local, const HostLayout& layout, int rank, int size, bool on_device)
    : local_(local),
      layout_(layout),
      rail_(on_device ? layout.device_rail : layout.rail),
      flat_(on_device ? layout.device_flat : layout.flat),
      rank_(rank),
      size_(size),
      on_device_(on_device),
      check_calls_(check_calls_across_hosts()),
      piece_bytes_(on_device ? 0 : host_piece_bytes(layout.link_bps)) {
  TORCH_INTERNAL_ASSERT(flat_, "pycoll: a group across hosts needs its flat inter-host group");
}

bool HierarchicalEngine::can_be_hierarchical() const {
  return layout_.uniform && rail_ && layout_.local_size() > 1 && layout_.num_hosts > 1;
}

bool HierarchicalEngine::hierarchical_form(const Collective& c, OpCode op, size_t bytes) const {
  if (c.algo == Algo::Flat || !can_be_hierarchical()) return false;
  if (c.algo == Algo::Hierarchical) return true;
  return choose_host_form(on_device_, op, layout_.num_hosts, layout_.local_size(), static_cast<int64_t>(bytes)) ==
         HostForm::Hierarchical;
}

void HierarchicalEngine::run_local(OpCode op, const at::Tensor& in, const at::Tensor& out, ReduceKind reduce,
                                   const c10::Stream& stream, int root) {
  Collective c;
  c.op = op;
  c.input = in;
  c.output = out;
  c.reduce = reduce;
  c.root = root;
  local_.run(c, stream);
}

int64_t HierarchicalEngine::pieces_of(size_t bytes, int64_t units) const {
  const int64_t piece = piece_bytes_;
  if (piece == 0 || static_cast<int64_t>(bytes) < kMinHostPieces * piece) return 1;
  return std::clamp<int64_t>(static_cast<int64_t>(bytes) / piece, 1, std::min(kMaxHostPieces, units));
}

bool HierarchicalEngine::hosts_hold_consecutive_ranks() const {
  const int L = layout_.local_size();
  for (int r = 0; r < size_; ++r)
    if (layout_.host_of[r] != r / L) return false;
  return true;
}

bool HierarchicalEngine::leader_form(size_t bytes) const { return !on_device_ && bytes <= kHostLeaderMaxBytes; }

bool HierarchicalEngine::serves(OpCode op, at::ScalarType dtype, const at::Device& device) {
  if (device.is_cuda() != on_device_) return false;
  if (moves_as_bytes(op)) return true;
  if (!reducible_dtype(dtype).has_value()) return false;
  // The local phases of a reduction run on the host's engine: a dtype its kernels do not reduce
  // goes through host memory instead (the backend's staged engine).
  return !on_device_ ||
         (local_.serves(OpCode::ReduceScatter, dtype, device) && local_.serves(OpCode::AllGather, dtype, device));
}

std::optional<CallCheck> HierarchicalEngine::start_check(const Collective& c) {
  if (!check_calls_) return std::nullopt;
  // On the flat Gloo group whatever the op, so that two different ops meet in one exchange, and
  // whatever the device: NCCL (the CUDA tensors' inter-host engine) checks nothing either, and
  // with sizes that differ it hangs or reads past a buffer. For CUDA tensors the exchange blocks
  // this host thread before the op is enqueued, as torch's TORCH_DISTRIBUTED_DEBUG=DETAIL does
  // for NCCL; the stream order is unchanged.
  return std::make_optional<CallCheck>(layout_.flat, c, size_, [this](int r) {
    return "rank " + std::to_string(r) + " (host " + std::to_string(layout_.host_of[r]) + ")";
  });
}

void HierarchicalEngine::all_reduce(const Collective& call, const at::Tensor& in, const at::Tensor& out, ReduceKind op,
                                    const c10::Stream& stream, bool* hierarchical) {
  const ReduceKind level_op = op == ReduceKind::Avg ? ReduceKind::Sum : op;
  const int64_t L = layout_.local_size();
  const int64_t n = in.numel();
  *hierarchical = hierarchical_form(call, OpCode::AllReduce, in.nbytes());
  // The exchange of call signatures runs while the host reduces (call_check.h).
  std::optional<CallCheck> check = start_check(call);
  if (n == 0 || !*hierarchical) {
    if (check) check->finish();
    if (n == 0) return;
  }
  if (!*hierarchical) {
    if (!out.is_same(in)) out.copy_(in);
    backend_all_reduce(flat_, out, level_op, on_device_);
  } else if (leader_form(in.nbytes())) {
    // 1. reduce to the host's first rank, 2. all-reduce among those ranks (their rail),
    // 3. broadcast inside the host: one inter-host call per host instead of one per rail.
    if (call.plan_text) *call.plan_text = "leader: host reduce, rail all_reduce, host broadcast";
    if (!out.is_same(in)) out.copy_(in);
    run_local(OpCode::Reduce, out, out, level_op, stream, /*root=*/0);
    if (check) check->finish();
    if (layout_.host_ranks.front() == rank_) backend_all_reduce(rail_, out, level_op, on_device_);
    run_local(OpCode::Broadcast, out, out, level_op, stream, /*root=*/0);
  } else {
    // 1. reduce-scatter inside the host, 2. all-reduce of this rank's shard on its rail,
    // 3. all-gather inside the host. A size L does not divide runs on a zero-padded copy.
    if (call.plan_text) *call.plan_text = "three phases: host reduce_scatter, rail all_reduce, host all_gather";
    const int64_t shard = ceil_div(n, L);
    const bool exact = shard * L == n;
    at::Tensor whole = exact ? in.reshape({-1}) : at::zeros({shard * L}, in.options());
    if (!exact) whole.narrow(0, 0, n).copy_(in.reshape({-1}));
    at::Tensor mine = scratch(shard, in.options());
    at::Tensor gathered = exact ? out.reshape({-1}) : whole;
    const int64_t per = ceil_div(shard, pieces_of(in.nbytes(), shard));
    const int64_t pieces = ceil_div(shard, per);
    if (pieces == 1) {
      run_local(OpCode::ReduceScatter, whole, mine, level_op, stream);
      if (check) check->finish();
      backend_all_reduce(rail_, mine, level_op, on_device_);
      run_local(OpCode::AllGather, mine, gathered, level_op, stream);
    } else {
      if (call.plan_text) *call.plan_text += ", in " + std::to_string(pieces) + " pieces";
      // Piece k: shard elements [k * per, ...) of every rank's shard, which is the run of L such
      // blocks at L * k * per of the whole. The rail all-reduces piece k while the host
      // reduce-scatters piece k + 1 and all-gathers piece k - 1.
      auto part = [&](const at::Tensor& t, int64_t k, int64_t scale) {
        const int64_t from = k * per;
        return t.narrow(0, scale * from, scale * std::min(per, shard - from));
      };
      run_local(OpCode::ReduceScatter, part(whole, 0, L), part(mine, 0, 1), level_op, stream);
      if (check) check->finish();
      StartedCall on_rail = start_gloo_all_reduce(*rail_, part(mine, 0, 1), level_op);
      for (int64_t k = 1; k < pieces; ++k) {
        run_local(OpCode::ReduceScatter, part(whole, k, L), part(mine, k, 1), level_op, stream);
        on_rail.wait();
        on_rail = start_gloo_all_reduce(*rail_, part(mine, k, 1), level_op);
        run_local(OpCode::AllGather, part(mine, k - 1, 1), part(gathered, k - 1, L), level_op, stream);
      }
      on_rail.wait();
      run_local(OpCode::AllGather, part(mine, pieces - 1, 1), part(gathered, pieces - 1, L), level_op, stream);
    }
    if (!exact) out.reshape({-1}).copy_(whole.narrow(0, 0, n));
  }
  if (op == ReduceKind::Avg) out.div_(size_);
}

Algo HierarchicalEngine::run(const Collective& c, const c10::Stream& stream) {
  const bool force_flat = c.algo == Algo::Flat;
  switch (c.op) {
    case OpCode::AllReduce: {
      bool hier = false;
      if (force_flat) {
        if (auto check = start_check(c)) check->finish();
        if (!c.output.is_same(c.input)) c.output.copy_(c.input);
        if (c.output.numel() > 0)
          backend_all_reduce(flat_, c.output, c.reduce == ReduceKind::Avg ? ReduceKind::Sum : c.reduce, on_device_);
        if (c.reduce == ReduceKind::Avg) c.output.div_(size_);
      } else {
        all_reduce(c, c.input, c.output, c.reduce, stream, &hier);
      }
      return hier ? Algo::Hierarchical : Algo::Flat;
    }
    case OpCode::ReduceScatter: {
      const ReduceKind level_op = c.reduce == ReduceKind::Avg ? ReduceKind::Sum : c.reduce;
      const ReduceKind wire_op = c.input.scalar_type() == at::kBool ? bool_as_uint8(level_op) : level_op;
      if (!(on_device_ && is_bitwise(wire_op))) return reduce_scatter(c, stream);
      // NCCL reduces no bitwise op: the all_reduce above (which gathers and folds), keeping this
      // rank's block.
      bool hier = false;
      at::Tensor whole = at::empty_like(c.input);
      all_reduce(c, c.input, whole, c.reduce, stream, &hier);
      const int64_t m = c.output.numel();
      c.output.reshape({-1}).copy_(whole.reshape({-1}).narrow(0, rank_ * m, m));
      return hier ? Algo::Hierarchical : Algo::Flat;
    }
    case OpCode::AllGather: return all_gather(c, stream);
    default: return run_flat(c);
  }
}

at::Tensor HierarchicalEngine::scratch(int64_t numel, const at::TensorOptions& options) {
  const int64_t bytes = numel * static_cast<int64_t>(options.dtype().itemsize());
  if (on_device_ || bytes > kKeptScratchMaxBytes) return at::empty({numel}, options);
  if (!scratch_.defined() || scratch_.numel() < bytes) scratch_ = at::empty({bytes}, options.dtype(at::kByte));
  return scratch_.narrow(0, 0, bytes).view(options.dtype().toScalarType());
}

const std::vector<int64_t>& HierarchicalEngine::rail_major_ranks() {
  if (rail_major_ranks_.empty()) {
    // Group ranks by host, ascending (a rank's local rank is its place there), then list rail l's
    // ranks (local rank l on every host, by host) for l = 0..L-1.
    std::vector<std::vector<int64_t>> by_host(layout_.num_hosts);
    for (int r = 0; r < size_; ++r) by_host[layout_.host_of[r]].push_back(r);
    for (int l = 0; l < layout_.local_size(); ++l)
      for (int h = 0; h < layout_.num_hosts; ++h) rail_major_ranks_.push_back(by_host[h][l]);
  }
  return rail_major_ranks_;
}

const at::Tensor& HierarchicalEngine::block_order(const at::Device& device) {
  if (!block_order_.defined()) block_order_ = at::tensor(rail_major_ranks(), at::kLong);
  if (block_order_.device() != device) block_order_ = block_order_.to(device);
  return block_order_;
}

void HierarchicalEngine::gather_rows(const at::Tensor& from, const at::Tensor& to) {
  const std::vector<int64_t>& order = rail_major_ranks();
  for (size_t i = 0; i < order.size(); ++i) to[static_cast<int64_t>(i)].copy_(from[order[i]]);
}

void HierarchicalEngine::scatter_rows(const at::Tensor& from, const at::Tensor& to) {
  const std::vector<int64_t>& order = rail_major_ranks();
  for (size_t i = 0; i < order.size(); ++i) to[order[i]].copy_(from[static_cast<int64_t>(i)]);
}

Algo HierarchicalEngine::reduce_scatter(const Collective& c, const c10::Stream& stream) {
  const ReduceKind level_op = c.reduce == ReduceKind::Avg ? ReduceKind::Sum : c.reduce;
  const int64_t N = layout_.num_hosts, m = c.output.numel();
  const bool hier = hierarchical_form(c, OpCode::ReduceScatter, c.input.nbytes());
  std::optional<CallCheck> check = start_check(c);
  if (m == 0) {
    if (check) check->finish();
    return hier ? Algo::Hierarchical : Algo::Flat;
  }
  if (hier && pieces_of(c.input.nbytes(), m) > 1) return reduce_scatter_in_pieces(c, stream, check);
  at::Tensor blocks = c.input.reshape({size_, m});
  at::Tensor across_hosts;
  if (!hier) {
    // In place (the output is this rank's block of the input), the flat form reads a copy.
    across_hosts = c.output.is_alias_of(c.input) ? blocks.reshape({-1}).clone() : blocks.reshape({-1});
  } else {
    // 1. the blocks rail l owns side by side, 2. reduce-scatter inside the host: local rank l
    // holds the host's sum of rail l's N blocks, 3. reduce-scatter of those along rail l.
    at::Tensor staged;
    if (on_device_) {
      staged = blocks.index_select(0, block_order(blocks.device())).reshape({-1});
      across_hosts = scratch(N * m, c.input.options());
    } else {
      at::Tensor buf = scratch((size_ + N) * m, c.input.options());
      staged = buf.narrow(0, 0, size_ * m);
      gather_rows(blocks, staged.view({size_, m}));
      across_hosts = buf.narrow(0, size_ * m, N * m);
    }
    run_local(OpCode::ReduceScatter, staged, across_hosts, level_op, stream);
  }
  if (check) check->finish();
  backend_reduce_scatter(hier ? *rail_ : *flat_, across_hosts, c.output, level_op, on_device_, /*as_gloo=*/!hier);
  if (c.reduce == ReduceKind::Avg) c.output.div_(size_);
  return hier ? Algo::Hierarchical : Algo::Flat;
}

Algo HierarchicalEngine::reduce_scatter_in_pieces(const Collective& c, const c10::Stream& stream,
                                                  std::optional<CallCheck>& check) {
  const ReduceKind level_op = c.reduce == ReduceKind::Avg ? ReduceKind::Sum : c.reduce;
  const int64_t N = layout_.num_hosts, m = c.output.numel();
  const int64_t per = ceil_div(m, pieces_of(c.input.nbytes(), m)), pieces = ceil_div(m, per);
  if (c.plan_text) *c.plan_text = "host reduce_scatter, rail reduce_scatter, in " + std::to_string(pieces) + " pieces";
  TORCH_INTERNAL_ASSERT(c.output.is_contiguous(), "pycoll: the engines get contiguous outputs");
  // Piece k: elements [k * per, ...) of every block. As in one piece: the blocks rail l owns side
  // by side, the host's reduce-scatter (local rank l holds rail l's N partial blocks), then the
  // rail's reduce-scatter into this rank's output, which runs while the host reduces piece k + 1.
  // In place, piece k of this rank's block is read before the rail writes it.
  at::Tensor blocks = c.input.reshape({size_, m}), out = c.output.reshape({-1});
  at::Tensor buf = scratch((size_ + N) * m, c.input.options());
  std::optional<StartedCall> on_rail;
  for (int64_t k = 0; k < pieces; ++k) {
    const int64_t from = k * per, len = std::min(per, m - from);
    at::Tensor staged = buf.narrow(0, size_ * from, size_ * len);
    at::Tensor across_hosts = buf.narrow(0, size_ * m + N * from, N * len);
    gather_rows(blocks.narrow(1, from, len), staged.view({size_, len}));
    run_local(OpCode::ReduceScatter, staged, across_hosts, level_op, stream);
    if (k == 0 && check) check->finish();
    if (on_rail) on_rail->wait();
    on_rail = start_reduce_scatter(*rail_, across_hosts, out.narrow(0, from, len), level_op, /*nccl=*/false,
                                   /*as_gloo=*/false);
  }
  on_rail->wait();
  if (c.reduce == ReduceKind::Avg) c.output.div_(size_);
  return Algo::Hierarchical;
}

Algo HierarchicalEngine::all_gather(const Collective& c, const c10::Stream& stream) {
  const int64_t L = layout_.local_size(), N = layout_.num_hosts;
  // On CUDA tensors the built-in choice is NCCL's one flat call (host_form_model.h).
  const bool hier = hierarchical_form(c, OpCode::AllGather, c.output.nbytes());
  if (!hier) return run_flat(c);
  if (auto check = start_check(c)) check->finish();  // before any byte crosses hosts
  at::Tensor in = bytes_of(c.input);
  const int64_t m = in.numel();
  if (m == 0) return Algo::Hierarchical;
  // 1. along the rail: the N blocks of this rank's local rank, by host; 2. inside the host: every
  // rail's N blocks, by local rank; 3. into group-rank order (rail_major_ranks lists the rank of
  // each (local rank, host) block). Across hosts each rank sends (N-1) blocks in N-1 steps, against
  // n-1 steps of the flat ring.
  const int64_t per = ceil_div(m, pieces_of(c.output.nbytes(), m));
  const int64_t pieces = ceil_div(m, per);
  if (pieces == 1 && !on_device_ && hosts_hold_consecutive_ranks()) {
    // Host h's ranks are the output's rows [h * L, (h + 1) * L): the host's all-gather of the
    // block its rail brought from host h writes them in place, with no staging buffer and no copy
    // into rank order, and this host's own rows are gathered while the rail carries the others.
    if (c.plan_text) *c.plan_text = "rail all_gather, host all_gather per host, into place";
    at::Tensor by_host = scratch(N * m, in.options());
    at::Tensor rows = bytes_of(c.output).view({N, L * m});
    auto on_rail = rail_->_allgather_base(by_host, in, on_current_stream<c10d::AllgatherOptions>());
    const int64_t mine = layout_.host_index;
    run_local(OpCode::AllGather, in, rows[mine], ReduceKind::Sum, stream);
    finish(on_rail);
    for (int64_t h = 0; h < N; ++h)
      if (h != mine) run_local(OpCode::AllGather, by_host.narrow(0, h * m, m), rows[h], ReduceKind::Sum, stream);
    return Algo::Hierarchical;
  }
  at::Tensor buf = scratch((N + L * N) * m, in.options());
  at::Tensor out = bytes_of(c.output).view({size_, m});
  if (pieces > 1 && c.plan_text)
    *c.plan_text = "rail all_gather, host all_gather, in " + std::to_string(pieces) + " pieces";
  // Piece k: bytes [k * per, ...) of every rank's input. The rail gathers piece k + 1 while the
  // host gathers piece k and puts it in place. In place (the input is this rank's block of the
  // output) is safe: a piece's input is on the rail before its columns of the output are written.
  auto rail_gather = [&](int64_t k) {
    const int64_t from = k * per, len = std::min(per, m - from);
    at::Tensor to = buf.narrow(0, N * from, N * len), mine = in.narrow(0, from, len);
    return rail_->_allgather_base(to, mine, on_current_stream<c10d::AllgatherOptions>());
  };
  c10::intrusive_ptr<c10d::Work> on_rail = rail_gather(0);
  for (int64_t k = 0; k < pieces; ++k) {
    const int64_t from = k * per, len = std::min(per, m - from);
    finish(on_rail);
    if (k + 1 < pieces) on_rail = rail_gather(k + 1);
    at::Tensor by_local = buf.narrow(0, N * m + L * N * from, L * N * len);
    run_local(OpCode::AllGather, buf.narrow(0, N * from, N * len), by_local, ReduceKind::Sum, stream);
    scatter_rows(by_local.view({L * N, len}), out.narrow(1, from, len));
  }
  return Algo::Hierarchical;
}

Algo HierarchicalEngine::run_flat(const Collective& c) {
  const auto& flat = flat_;
  if (auto check = start_check(c)) check->finish();
  switch (c.op) {
    case OpCode::Reduce: {
      if (!c.output.is_same(c.input)) c.output.copy_(c.input);
      if (c.output.numel() == 0) return Algo::Flat;
      auto [wire, wire_op] = inter_host_form(c.output, c.reduce);
      std::vector<at::Tensor> ts{wire};
      auto opts = on_current_stream<c10d::ReduceOptions>();
      opts.rootRank = c.root;
      opts.reduceOp = to_c10d(wire_op);
      finish(flat->reduce(ts, opts));
      if (rank_ == c.root) {
        if (!wire.is_same(c.output)) c.output.copy_(wire);
        if (c.reduce == ReduceKind::Avg) c.output.div_(size_);
      }
      return Algo::Flat;
    }
    case OpCode::AllGather: {
      at::Tensor out = bytes_of(c.output), in = bytes_of(c.input);
      finish(flat->_allgather_base(out, in, on_current_stream<c10d::AllgatherOptions>()));
      return Algo::Flat;
    }
    case OpCode::Broadcast: {
      std::vector<at::Tensor> ts{bytes_of(c.output)};
      auto opts = on_current_stream<c10d::BroadcastOptions>();
      opts.rootRank = c.root;
      finish(flat->broadcast(ts, opts));
      return Algo::Flat;
    }
    case OpCode::AllToAll: {
      at::Tensor out = bytes_of(c.output), in = bytes_of(c.input);
      std::vector<int64_t> recv = c.splits.recv_bytes, send = c.splits.send_bytes;
      finish(flat->alltoall_base(out, in, recv, send, on_current_stream<c10d::AllToAllOptions>()));
      return Algo::Flat;
    }
    case OpCode::Gather: {
      std::vector<at::Tensor> in{bytes_of(c.input)};
      std::vector<std::vector<at::Tensor>> outs;
      if (rank_ == c.root) {
        const int64_t m = in[0].numel();
        at::Tensor all = bytes_of(c.output);
        outs.emplace_back();
        for (int r = 0; r < size_; ++r) outs[0].push_back(all.narrow(0, r * m, m));
      }
      auto opts = on_current_stream<c10d::GatherOptions>();
      opts.rootRank = c.root;
      finish(flat->gather(outs, in, opts));
      return Algo::Flat;
    }
    case OpCode::Scatter: {
      std::vector<at::Tensor> out{bytes_of(c.output)};
      std::vector<std::vector<at::Tensor>> ins;
      if (rank_ == c.root) {
        const int64_t m = out[0].numel();
        at::Tensor all = bytes_of(c.input);
        ins.emplace_back();
        for (int r = 0; r < size_; ++r) ins[0].push_back(all.narrow(0, r * m, m));
      }
      auto opts = on_current_stream<c10d::ScatterOptions>();
      opts.rootRank = c.root;
      finish(flat->scatter(out, ins, opts));
      return Algo::Flat;
    }
    case OpCode::Barrier:
      finish(flat->barrier(c10d::BarrierOptions()));  // torch's NCCL barrier waits on its own stream
      return Algo::Flat;
    case OpCode::AllReduce:
    case OpCode::ReduceScatter: break;
  }
  TORCH_INTERNAL_ASSERT(false, "pycoll: the hierarchical engine's flat path got ", op_name(c.op));
}

}  // namespace pycoll

// The CUDA engine's schedule programs: the generic kernel, its step tables, and the launch
// (cuda/schedule_kernel.h says how a program maps onto the workspace). The data verbs are the
// other kernels' (primitives.cuh: copy_run, and reduce_run through reduce_dispatch for every
// dtype and reduce op the engine has); the channel verbs are channel.cuh's.
#include "cuda/schedule_kernel.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <c10/cuda/CUDAGuard.h>

#include "common/check.h"
#include "common/cuda_check.h"
#include "cuda/cuda_engine.h"
#include "cuda/kernels/channel.cuh"
#include "transport/cuda_ipc/check_word.h"
#include "transport/cuda_ipc/workspace.h"

namespace pycoll {

// One step as the kernel reads it: the program's step without what the channels count themselves
// (message and channel numbers: a channel's messages go in order through its FIFO).
struct ScheduleStepDev {
  int8_t op;       // ScheduleOp
  int8_t src_buf;  // ScheduleBuffer
  int8_t dst_buf;
  int8_t waited;  // a step of another lane depends on this one: its lane posts its progress
  int32_t src_first, src_count;
  int32_t dst_first, dst_count;
  int32_t peer;     // program ranks
  int32_t to_peer;  // RecvReduceSend: the send's peer
  int32_t deps_begin, deps_end;
};

namespace kernels {
namespace {

// The progress words: lane l's at l * kProgressStride, then the lanes' arrivals at a segment's
// end, then the count of CTAs that finished the call (128 bytes apart: different writers).
constexpr int kProgressStride = 16;
constexpr int kArrivedWord = kMaxScheduleLanes * kProgressStride;
constexpr int kFinishedWord = (kMaxScheduleLanes + 1) * kProgressStride;
constexpr int kProgressWords = (kMaxScheduleLanes + 2) * kProgressStride;

__device__ __forceinline__ int64_t lesser(int64_t a, int64_t b) { return a < b ? a : b; }

struct ScheduleArgs {
  cuda_ipc::DeviceHandle h;
  const ScheduleStepDev* steps;  // every lane's steps, lane after lane
  const ScheduleDep* deps;
  uint64_t* progress;  // kProgressWords, zero when a call starts
  char* in;
  char* out;
  char* scratch;
  int64_t block;
  int64_t segments;
  uint64_t check;                             // the call's check word
  uint64_t digest;                            // the program's, in every message's tag word
  int32_t lane_first[kMaxScheduleLanes + 1];  // lane l's steps: [lane_first[l], lane_first[l + 1])
  int32_t chunks;
  int32_t rank_shift;
  int32_t elem_size;
  int32_t op;    // OpCode, for error reports
  int32_t meet;  // the lanes meet between segments (scratch and several lanes)
  DType dtype;
  ReduceOp rop;
};

// Segment k of every block: elements [b * block + off, + len), chunks of s elements (the last
// ones shorter or empty), `stride` bytes apart in a slot. Every rank cuts alike.
struct SegmentDev {
  int64_t block, off, len, s, stride;
  int32_t chunks;

  __device__ void chunk(int buf, int64_t c, int64_t& at, int64_t& n) const {
    if (buf == int(ScheduleBuffer::Scratch)) {
      at = c * s;
      n = s;
      return;
    }
    const int64_t blk = c / chunks, j = c % chunks;
    const int64_t lo = lesser(j * s, len), hi = lesser((j + 1) * s, len);
    at = blk * block + off + lo;
    n = hi - lo;
  }
};

__device__ SegmentDev segment_of(const ScheduleArgs& a, int64_t k) {
  const int64_t q = a.block / a.segments, r = a.block % a.segments;
  SegmentDev g;
  g.block = a.block;
  g.off = q * k + lesser(k, r);
  g.len = q + (k < r ? 1 : 0);
  g.chunks = a.chunks;
  g.s = (g.len + a.chunks - 1) / a.chunks;
  g.stride = (g.s * a.elem_size + 15) / 16 * 16;
  return g;
}

// Block-wide copies (b == nullptr) or reductions d = a op b of `n` elements, merged while a piece
// continues the last one. Every thread adds the same pieces.
struct Spans {
  char* d = nullptr;
  const char* a = nullptr;
  const char* b = nullptr;
  int64_t n = 0;
  int32_t elem;
  DType dtype;
  ReduceOp op;

  __device__ Spans(int32_t e, DType t, ReduceOp o) : elem(e), dtype(t), op(o) {}
  __device__ void add(char* dst, const char* src, const char* src2, int64_t cnt) {
    if (cnt <= 0) return;
    const int64_t run = n * elem;
    if (n > 0 && dst == d + run && src == a + run && (src2 == nullptr) == (b == nullptr) &&
        (src2 == nullptr || src2 == b + run)) {
      n += cnt;
      return;
    }
    flush();
    d = dst;
    a = src;
    b = src2;
    n = cnt;
  }
  __device__ void flush() {
    if (n <= 0) return;
    if (b == nullptr) {
      CopyJob j;
      j.src = a;
      j.dst[0] = d;
      j.nd = 1;
      j.bytes = n * elem;
      copy_run(&j, 1);
    } else {
      ReduceJob j;
      j.src[0] = a;
      j.src[1] = b;
      j.ns = 2;
      j.dst[0] = d;
      j.nd = 1;
      j.div = 1;
      j.count = n;
      reduce_dispatch(dtype, op, &j);
    }
    n = 0;
  }
};

__device__ __forceinline__ char* buffer_of(const ScheduleArgs& a, int buf) {
  return buf == int(ScheduleBuffer::In) ? a.in : buf == int(ScheduleBuffer::Out) ? a.out : a.scratch;
}

// The slot number of a slot address of channel (src -> dst, block b), in dst's workspace at `base`.
__device__ __forceinline__ int slot_number(const DeviceHandle* h, int src, int dst, int b, const char* slot,
                                           const char* base) {
  const ChannelSetLayout& L = h->layout.coll;
  return int((slot - (base + L.slot_offset(h->nranks, src, dst, b, 0))) / L.slot_bytes);
}

// Thread 0, after acquire: the program's digest into the tag word of the slot just acquired
// towards `peer` (published with the message by release).
__device__ void put_digest(const ScheduleArgs& a, const DeviceHandle* h, int peer, int b, const char* slot) {
  const int s = slot_number(h, h->rank, peer, b, slot, h->base[peer]);
  *reinterpret_cast<volatile uint64_t*>(h->base[peer] + h->layout.split.tag_offset(h->rank, b, s)) = a.digest;
}

// Thread 0, after acquire: false (and the mismatch reported) where the message from `peer` is one
// of another program.
__device__ bool digest_matches(const ScheduleArgs& a, const DeviceHandle* h, int peer, int b, const char* slot) {
  const int me = h->rank;
  const int s = slot_number(h, peer, me, b, slot, h->base[me]);
  const uint64_t got =
      *reinterpret_cast<const volatile uint64_t*>(h->base[me] + h->layout.split.tag_offset(peer, b, s));
  if (got == a.digest) return true;
  const uint64_t plan_mask = uint64_t(0xf) << cuda_ipc::kCheckPlanShift;
  const uint64_t theirs = (a.check & ~plan_mask) | (uint64_t(kOtherScheduleCheckPlan) << cuda_ipc::kCheckPlanShift);
  raise_error(h, cuda_ipc::kErrOpMismatch, WaitSite{a.op, b, peer, cuda_ipc::kWaitData}, a.check, theirs, 0);
  return false;
}

// Every thread: thread 0's verdict.
__device__ bool all_agree(int* flag, bool mine) {
  __syncthreads();  // every thread has read the flag's last value
  if (threadIdx.x == 0) *flag = mine ? 1 : 0;
  __syncthreads();
  return *flag != 0;
}

__device__ bool run_step(const ScheduleArgs& a, BlockChannels& ch, StepShared* sh, int* flag, const ScheduleStepDev& st,
                         const SegmentDev& g) {
  const DeviceHandle* h = sh->h;
  const int n = h->nranks;
  const int b = int(blockIdx.x);
  const int64_t E = a.elem_size;
  int64_t at = 0, cnt = 0, src_at = 0, src_cnt = 0;
  switch (static_cast<ScheduleOp>(st.op)) {
    case ScheduleOp::Send: {
      const int p = (st.peer + a.rank_shift) % n;
      if (!ch.acquire(1u << p, 0u)) return false;
      char* slot = sh->oslot[p];
      if (threadIdx.x == 0) put_digest(a, h, p, b, slot);
      const char* from = buffer_of(a, st.src_buf);
      Spans copy(a.elem_size, a.dtype, a.rop);
      for (int32_t i = 0; i < st.src_count; ++i) {
        g.chunk(st.src_buf, st.src_first + i, at, cnt);
        copy.add(slot + i * g.stride, from + at * E, nullptr, cnt);
      }
      copy.flush();
      ch.release(1u << p, 0u);
      return true;
    }
    case ScheduleOp::Recv:
    case ScheduleOp::RecvReduce: {
      const int p = (st.peer + a.rank_shift) % n;
      if (!ch.acquire(0u, 1u << p)) return false;
      const char* slot = sh->islot[p];
      if (!all_agree(flag, threadIdx.x != 0 || digest_matches(a, h, p, b, slot))) return false;
      char* to = buffer_of(a, st.dst_buf);
      const bool reduce = st.op == int8_t(ScheduleOp::RecvReduce);
      Spans take(a.elem_size, a.dtype, a.rop);
      for (int32_t i = 0; i < st.dst_count; ++i) {
        g.chunk(st.dst_buf, st.dst_first + i, at, cnt);
        g.chunk(st.src_buf, st.src_first + i, src_at, src_cnt);
        char* d = to + at * E;
        const char* m = slot + i * g.stride;
        take.add(d, reduce ? d : m, reduce ? m : nullptr, lesser(cnt, src_cnt));
      }
      take.flush();
      ch.release(0u, 1u << p);
      return true;
    }
    case ScheduleOp::Copy:
    case ScheduleOp::Reduce: {
      char* to = buffer_of(a, st.dst_buf);
      const char* from = buffer_of(a, st.src_buf);
      const bool reduce = st.op == int8_t(ScheduleOp::Reduce);
      Spans move(a.elem_size, a.dtype, a.rop);
      for (int32_t i = 0; i < lesser(st.dst_count, st.src_count); ++i) {
        g.chunk(st.dst_buf, st.dst_first + i, at, cnt);
        g.chunk(st.src_buf, st.src_first + i, src_at, src_cnt);
        char* d = to + at * E;
        const char* s = from + src_at * E;
        move.add(d, reduce ? d : s, reduce ? s : nullptr, lesser(cnt, src_cnt));
      }
      move.flush();
      __syncthreads();  // the next step may read what other threads wrote
      return true;
    }
    case ScheduleOp::RecvReduceSend: {
      // The message from `peer` reduced with R straight into the slot of the send to `to_peer`;
      // R's elements beyond what the message holds go as they are.
      const int p = (st.peer + a.rank_shift) % n;
      const int q = (st.to_peer + a.rank_shift) % n;
      if (!ch.acquire(1u << q, 1u << p)) return false;
      const char* in_slot = sh->islot[p];
      char* out_slot = sh->oslot[q];
      if (!all_agree(flag, threadIdx.x != 0 || digest_matches(a, h, p, b, in_slot))) return false;
      if (threadIdx.x == 0) put_digest(a, h, q, b, out_slot);
      const char* mine = buffer_of(a, st.dst_buf);
      Spans reduce(a.elem_size, a.dtype, a.rop);
      Spans copy(a.elem_size, a.dtype, a.rop);
      for (int32_t i = 0; i < st.dst_count; ++i) {
        g.chunk(st.dst_buf, st.dst_first + i, at, cnt);
        g.chunk(st.src_buf, st.src_first + i, src_at, src_cnt);
        const int64_t both = lesser(cnt, src_cnt);
        char* o = out_slot + i * g.stride;
        reduce.add(o, mine + at * E, in_slot + i * g.stride, both);
        copy.add(o + both * E, mine + (at + both) * E, nullptr, cnt - both);
      }
      reduce.flush();
      copy.flush();
      ch.release(1u << q, 1u << p);
      return true;
    }
    case ScheduleOp::FusedAway: return true;
  }
  return true;
}

// Thread 0 waits for the steps of other lanes that `st` depends on, in segment k.
__device__ bool wait_deps(const ScheduleArgs& a, const DeviceHandle* h, const ScheduleStepDev& st, int64_t k) {
  bool ok = true;
  for (int32_t d = st.deps_begin; ok && d < st.deps_end; ++d) {
    const ScheduleDep dep = a.deps[d];
    const int64_t len = a.lane_first[dep.lane + 1] - a.lane_first[dep.lane];
    const uint64_t target = uint64_t(k * len + dep.index + 1);
    ok = wait_local_ge(h, a.progress + dep.lane * kProgressStride, target,
                       WaitSite{a.op, int(blockIdx.x), h->rank, cuda_ipc::kWaitLocal});
  }
  return ok;
}

// The lanes meet before segment k (k >= 1): none overwrites scratch that another still sends.
__device__ bool meet(const ScheduleArgs& a, const DeviceHandle* h, int64_t k, int* flag) {
  __syncthreads();
  bool ok = true;
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(reinterpret_cast<unsigned long long*>(a.progress + kArrivedWord), 1ull);
    ok = wait_local_ge(h, a.progress + kArrivedWord, uint64_t(k) * gridDim.x,
                       WaitSite{a.op, int(blockIdx.x), h->rank, cuda_ipc::kWaitLocal});
  }
  return all_agree(flag, threadIdx.x != 0 || ok);
}

__device__ bool run_lane(const ScheduleArgs& a, BlockChannels& ch, StepShared* sh, int* flag) {
  const DeviceHandle* h = sh->h;
  const int lane = int(blockIdx.x);
  const int first = a.lane_first[lane];
  const int len = a.lane_first[lane + 1] - first;
  for (int64_t k = 0; k < a.segments; ++k) {
    if (k > 0 && a.meet && !meet(a, h, k, flag)) return false;
    const SegmentDev g = segment_of(a, k);
    for (int i = 0; i < len; ++i) {
      const ScheduleStepDev st = a.steps[first + i];
      if (st.deps_end > st.deps_begin && !all_agree(flag, threadIdx.x != 0 || wait_deps(a, h, st, k))) return false;
      if (!run_step(a, ch, sh, flag, st, g)) return false;
      if (st.waited) {
        __syncthreads();  // every thread's part of the step is done
        if (threadIdx.x == 0) st_release_gpu(a.progress + lane * kProgressStride, uint64_t(k * len + i + 1));
      }
    }
  }
  return true;
}

__global__ void __launch_bounds__(kThreads, 1) schedule_kernel(const __grid_constant__ ScheduleArgs args) {
  __shared__ ScheduleArgs sa;
  __shared__ StepShared sh;
  __shared__ int flag;
  load_args(&sh, &sa, args, args.dtype, args.rop);
  const ScheduleArgs& a = sa;
  BlockChannels ch(&sh, &a.h.layout.coll, a.op, a.check);  // channel = blockIdx.x = the lane
  if (run_lane(a, ch, &sh, &flag)) ch.finish();
  // The last CTA to finish sets the progress words back to 0 for the next call.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned long long* finished = reinterpret_cast<unsigned long long*>(a.progress + kFinishedWord);
    if (atomicAdd(finished, 1ull) + 1 == gridDim.x) {
      __threadfence();
      for (unsigned l = 0; l < gridDim.x; ++l) a.progress[l * kProgressStride] = 0;
      a.progress[kArrivedWord] = 0;
      *finished = 0;
    }
  }
}

// Avg: the result divided by `div`, in the dtype's accumulator (as the other kernels' final step).
__global__ void __launch_bounds__(kThreads)
    schedule_scale_kernel(char* buf, int64_t count, int64_t per_cta, int32_t elem, DType dtype, int32_t div) {
  const int64_t lo = int64_t(blockIdx.x) * per_cta;
  const int64_t hi = lesser(count, lo + per_cta);
  if (lo >= hi) return;
  ReduceJob j;
  j.src[0] = buf + lo * elem;
  j.dst[0] = buf + lo * elem;
  j.ns = 1;
  j.nd = 1;
  j.div = div;
  j.count = hi - lo;
  reduce_dispatch(dtype, ReduceOp::Sum, &j);
}

}  // namespace
}  // namespace kernels

ScheduleGeometry schedule_geometry(const ScheduleProgram& p, int64_t block, int64_t elem, int64_t slot_bytes) {
  ScheduleGeometry g;
  if (block <= 0) return g;
  const int chunks = std::max(1, p.chunks);
  // The longest segment whose largest message fits one slot, chunks 16-byte aligned in it.
  int64_t seg = block;
  if (p.max_message_chunks > 0) {
    const int64_t per_chunk = (slot_bytes / p.max_message_chunks) / 16 * 16;
    const int64_t s_max = per_chunk / elem;
    if (s_max < 1) {
      throw std::invalid_argument(str("pycoll: schedule program '", p.name, "' sends messages of ",
                                      p.max_message_chunks, " chunks, more than the CUDA engine's slots of ",
                                      slot_bytes,
                                      " bytes hold (a chunk takes 16 bytes at least): raise "
                                      "PYCOLL_CUDA_SLOT_KIB or send fewer chunks per message"));
    }
    seg = std::min<int64_t>(block, s_max * chunks);
  }
  g.segments = (block + seg - 1) / seg;
  const int64_t longest = (block + g.segments - 1) / g.segments;
  const int64_t s = (longest + chunks - 1) / chunks;
  g.scratch_bytes = int64_t(p.scratch) * s * elem;
  return g;
}

// The step tables of each (program, rank) on this engine's device, uploaded at first use and kept
// (with the program, so that its address is not reused), and the lanes' progress words.
class ScheduleKernels {
 public:
  struct Tables {
    ScheduleStepDev* steps = nullptr;
    ScheduleDep* deps = nullptr;
    std::array<int32_t, kMaxScheduleLanes + 1> lane_first{};
  };

  ScheduleKernels() = default;
  ScheduleKernels(const ScheduleKernels&) = delete;
  ScheduleKernels& operator=(const ScheduleKernels&) = delete;
  ~ScheduleKernels() {
    for (auto& e : kept_) {
      (void)cudaFree(e.second.second.steps);
      (void)cudaFree(e.second.second.deps);
    }
    if (progress_ != nullptr) (void)cudaFree(progress_);
    if (side_ != nullptr) (void)cudaStreamDestroy(side_);
  }

  const Tables& tables(const std::shared_ptr<const ScheduleProgram>& p, int me) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto key = std::make_pair(p.get(), me);
    auto it = kept_.find(key);
    if (it != kept_.end()) return it->second.second;
    const OffCapture off_capture;  // the first call of a program may come while a graph is captured
    const RankSchedule& mine = p->rank.at(size_t(me));
    Tables t;
    std::vector<ScheduleStepDev> steps;
    std::vector<std::vector<int8_t>> waited(mine.lanes.size());
    for (size_t l = 0; l < mine.lanes.size(); ++l) waited[l].assign(mine.lanes[l].size(), 0);
    for (const ScheduleDep& d : mine.deps) {
      TORCH_CHECK(d.lane >= 0 && size_t(d.lane) < waited.size() && d.index >= 0 &&
                      size_t(d.index) < waited[size_t(d.lane)].size(),
                  "pycoll: schedule program '", p->name, "' has a dependency on a step that does not exist");
      waited[size_t(d.lane)][size_t(d.index)] = 1;
    }
    const int lanes = std::max(1, p->lanes);
    for (int l = 0; l < lanes; ++l) {
      t.lane_first[size_t(l)] = int32_t(steps.size());
      if (size_t(l) >= mine.lanes.size()) continue;  // a lane this rank does not use
      for (size_t i = 0; i < mine.lanes[size_t(l)].size(); ++i) {
        const ScheduleStep& s = mine.lanes[size_t(l)][i];
        ScheduleStepDev d{};
        d.op = int8_t(s.op);
        d.src_buf = int8_t(s.src.buffer);
        d.dst_buf = int8_t(s.dst.buffer);
        d.waited = waited[size_t(l)][i];
        d.src_first = s.src.first;
        d.src_count = s.src.count;
        d.dst_first = s.dst.first;
        d.dst_count = s.dst.count;
        d.peer = s.peer;
        d.to_peer = s.to_peer;
        d.deps_begin = s.deps_begin;
        d.deps_end = s.deps_end;
        steps.push_back(d);
      }
    }
    for (int l = lanes; l <= kMaxScheduleLanes; ++l) t.lane_first[size_t(l)] = int32_t(steps.size());
    t.steps = upload(steps, p->name);
    t.deps = upload(mine.deps, p->name);
    sync_side("its step table", p->name);
    return kept_.emplace(key, std::make_pair(p, t)).first->second.second;
  }

  uint64_t* progress() {
    std::lock_guard<std::mutex> lock(mu_);
    if (progress_ == nullptr) {
      const OffCapture off_capture;
      const size_t bytes = size_t(kernels::kProgressWords) * sizeof(uint64_t);
      PYCOLL_CUDA_CHECK(cudaMalloc(&progress_, bytes), "pycoll: schedule program progress words: ", "cudaMalloc");
      PYCOLL_CUDA_CHECK(cudaMemsetAsync(progress_, 0, bytes, side()),
                        "pycoll: schedule program progress words: ", "cudaMemsetAsync");
      sync_side("its progress words", "");
    }
    return progress_;
  }

 private:
  // Allocations and copies outside any graph that this thread captures: the thread's capture mode
  // relaxed (cudaMalloc is then allowed), the copies on a stream of their own that nothing
  // captures, waited for on the host before the kernel that reads them is launched.
  struct OffCapture {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    OffCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode); }
    ~OffCapture() { (void)cudaThreadExchangeStreamCaptureMode(&mode); }
  };
  cudaStream_t side() {
    if (side_ == nullptr) {
      PYCOLL_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking),
                        "pycoll: schedule programs' upload stream: ", "cudaStreamCreateWithFlags");
    }
    return side_;
  }
  void sync_side(const char* what, const std::string& name) {
    PYCOLL_CUDA_CHECK(cudaStreamSynchronize(side()), "pycoll: schedule program '", name, "': ", what, ": ",
                      "cudaStreamSynchronize");
  }
  template <class T>
  T* upload(const std::vector<T>& v, const std::string& name) {
    if (v.empty()) return nullptr;
    void* d = nullptr;
    PYCOLL_CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T)), "pycoll: schedule program '", name,
                      "': its step table: ", "cudaMalloc");
    PYCOLL_CUDA_CHECK(cudaMemcpyAsync(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, side()),
                      "pycoll: schedule program '", name, "': its step table: ", "cudaMemcpyAsync");
    return static_cast<T*>(d);
  }

  std::mutex mu_;
  std::map<std::pair<const ScheduleProgram*, int>, std::pair<std::shared_ptr<const ScheduleProgram>, Tables>> kept_;
  uint64_t* progress_ = nullptr;
  cudaStream_t side_ = nullptr;
};

ScheduleGeometry CudaEngine::plan_schedule(const ScheduleProgram& p, int64_t block, int64_t elem) const {
  const cuda_ipc::ChannelSetLayout& L = ws_->layout().coll;
  const int max_lanes = std::min({kMaxScheduleLanes, int(L.nblocks), sms_});
  if (p.lanes > max_lanes) {
    throw std::invalid_argument(str("pycoll: schedule program '", p.name, "' has ", p.lanes,
                                    " lanes; the CUDA engine runs at most ", max_lanes,
                                    " (one thread block per lane, each on a channel of its own)"));
  }
  if (p.channel_depth > L.nslots) {
    throw std::invalid_argument(str("pycoll: schedule program '", p.name, "' keeps ", p.channel_depth,
                                    " messages in flight per channel; the CUDA engine's channels hold ", L.nslots));
  }
  return schedule_geometry(p, block, elem, L.slot_bytes);
}

void CudaEngine::run_schedule(const ScheduleCall& c, cudaStream_t stream) {
  const char* kOp = schedule_collective_name(c.op);
  TORCH_INTERNAL_ASSERT(c.program != nullptr && kOp != nullptr, "pycoll: a schedule call without its program");
  const ScheduleProgram& p = *c.program;
  const int64_t elem = int64_t(dtype_size(c.dtype));
  const ScheduleGeometry g = plan_schedule(p, c.block, elem);
  if (g.segments == 0) return;
  TORCH_INTERNAL_ASSERT(p.ranks == size_ && c.me >= 0 && c.me < size_, "pycoll: schedule program '", p.name,
                        "' is for ", p.ranks, " ranks, the group has ", size_);
  TORCH_INTERNAL_ASSERT(g.scratch_bytes == 0 || c.scratch != nullptr, "pycoll: schedule program '", p.name,
                        "' was given no scratch");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_usable(kOp);
  if (!schedule_) schedule_ = std::make_shared<ScheduleKernels>();
  const ScheduleKernels::Tables& t = schedule_->tables(c.program, c.me);

  kernels::ScheduleArgs a{};
  a.h = ws_->handle();
  a.steps = t.steps;
  a.deps = t.deps;
  a.progress = schedule_->progress();
  a.in = c.in;
  a.out = c.out;
  a.scratch = c.scratch;
  a.block = c.block;
  a.segments = g.segments;
  a.check = cuda_ipc::collective_check_word(int(c.op), c.reduces ? int(c.dtype) : 0, c.reduces ? int(c.rop) : 0, c.root,
                                            c.check_count, static_cast<cuda_ipc::CheckPlan>(kScheduleCheckPlan));
  a.digest = c.poisoned ? ~p.digest : p.digest;
  std::copy(t.lane_first.begin(), t.lane_first.end(), a.lane_first);
  a.chunks = std::max(1, p.chunks);
  a.rank_shift = c.rank_shift;
  a.elem_size = int32_t(elem);
  a.op = int32_t(c.op);
  const int lanes = std::max(1, p.lanes);
  a.meet = p.scratch > 0 && lanes > 1 ? 1 : 0;
  a.dtype = c.dtype;
  a.rop = c.rop;
  kernels::schedule_kernel<<<lanes, kernels::kThreads, 0, stream>>>(a);
  PYCOLL_CUDA_CHECK(cudaGetLastError(), "pycoll::", kOp, ": schedule program '", p.name, "': ", "kernel launch");
  if (c.poisoned && !poisoned_run_in_step(stream)) {
    mark_out_of_step(
        "this rank refused an earlier all_to_all's splits after running its schedule program poisoned, and its "
        "peers stopped there");
  }

  if (c.div > 1 && c.holds_result) {
    // 16-byte aligned pieces of at least 64 KiB over at most 64 CTAs.
    const int64_t per_min = std::max<int64_t>(1, (int64_t(64) << 10) / elem);
    const int64_t ctas = std::min<int64_t>(64, (c.block + per_min - 1) / per_min);
    int64_t per = (c.block + ctas - 1) / ctas;
    const int64_t pack = std::max<int64_t>(1, 16 / elem);
    per = (per + pack - 1) / pack * pack;
    kernels::schedule_scale_kernel<<<int(ctas), kernels::kThreads, 0, stream>>>(c.out, c.block, per, int32_t(elem),
                                                                                c.dtype, c.div);
    PYCOLL_CUDA_CHECK(cudaGetLastError(), "pycoll::", kOp, ": schedule program '", p.name, "': ", "avg launch");
  }
}

// A poisoned run (this rank refused its all_to_all splits) stays in step only where every rank ran
// it poisoned (they all passed the same unequal splits: the digests agree and it completes). Where
// a peer ran it healthy, that peer stops at this rank's first message and this rank's kernel
// reports the mismatch or waits for a message that never comes. Waits a bounded time to tell
// (an error path: a poisoned run is about to raise).
bool CudaEngine::poisoned_run_in_step(cudaStream_t stream) {
  return stream_idle_within(stream, std::chrono::seconds(5)) && ws_->error_code() == 0;
}

}  // namespace pycoll

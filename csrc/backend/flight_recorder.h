// The flight recorder: a fixed ring of the most recent ops of every group in this process, kept so
// that a job that hangs or fails leaves behind which op each rank was in (torch keeps one for
// NCCL and Gloo; this one follows its dump layout, docs/tracing.md).
//
// Terms:
//   entry   - one op of one group: what it was (op, sizes, dtypes, peer), its sequence numbers,
//             and its state: scheduled (issued by the caller), started (an engine thread or the
//             device queue began it), completed (finished, or failed: `error` says why).
//   handle  - what record() returns: the entry's slot and its record id. A later update through a
//             handle whose slot was reused by a newer op (the ring wrapped) does nothing.
//   group   - a process group as the recorder knows it: name, description, global ranks; kept
//             after the group is destroyed, since entries still name it.
//
// Cost: every entry is a fixed-size struct in a ring allocated once; recording allocates nothing
// and takes no process-wide lock (benchmarked by flight_recorder_bench(), docs/tracing.md).
// record() claims a record id with one atomic increment; record() and each state update then
// write the entry under its slot's own spin lock (one compare-and-swap, one store), which a
// dump also takes to copy the entry whole. A group's pg_status comes from the entries still in
// the ring and, for those the ring overwrote, from per-group maxima folded in when the slot is
// reused. Per op: three clock reads (created, started, completed; a send or receive starts when
// recorded: two). A failure's error and the Python stacks take a mutex (rare, or opted into).
// Size: PYCOLL_FR_BUFFER_SIZE, else TORCH_FR_BUFFER_SIZE, else 2000; 0 turns recording off.
// With PYCOLL_FR_STACKS=1 each op also keeps the caller's Python stack (torch's
// CapturedTraceback, gathered before any lock; turned into file, function and line only when a
// dump is written): that allocates, hence off by default.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch {
struct CapturedTraceback;
}

namespace pycoll {

struct FrHandle {
  int64_t slot = -1;  // -1: not recorded (the recorder is off)
  uint64_t record_id = 0;
  int pg_id = -1;
  bool recorded() const { return slot >= 0; }
};

class FlightRecorder {
 public:
  static constexpr int kMaxTensors = 4;  // tensors per side recorded; longer lists keep their first ones
  static constexpr int kMaxDims = 4;     // dims per tensor; a tensor of more dims is recorded flat

  enum class State : int8_t { Scheduled = 0, Started = 1, Completed = 2 };

  static FlightRecorder& get();

  bool enabled() const { return capacity_ > 0; }
  size_t capacity() const { return capacity_; }

  // A group joins when it is made; returns its id (pg_id in dumps). `ranks` are global ranks.
  int add_group(const std::string& name, const std::string& desc, const std::vector<int64_t>& ranks);
  // The group's description and global ranks, once Python knows them (torch's creator has them).
  void describe_group(int pg_id, const std::string& desc, const std::vector<int64_t>& ranks);
  // This process's rank in the job (names the dump file) and the job's size.
  void set_process_rank(int rank, int world_size);
  int process_rank() const;

  // Tensors as a pointer and a count (a vector's, or one tensor's), so that recording copies
  // nothing into a new container.
  struct Tensors {
    const at::Tensor* data = nullptr;
    size_t size = 0;
    Tensors() = default;
    Tensors(const at::Tensor& t) : data(&t), size(1) {}                            // NOLINT: implicit on purpose
    Tensors(const std::vector<at::Tensor>& v) : data(v.data()), size(v.size()) {}  // NOLINT
  };
  // A new op of group pg_id. `op` is a static name ("all_reduce"); `peer` the other rank of a
  // send/recv (global), else -1. Inputs that are also outputs are left out of the inputs when
  // `inputs_may_hold_outputs` (an OpCall's tensor list holds both); an op in place then records
  // its outputs as its inputs too. `started`: the op is under way once recorded (a send or
  // receive is posted), as record() then started() but with one clock read.
  FrHandle record(int pg_id, uint64_t op_id, uint64_t collective_seq, uint64_t p2p_seq, const char* op, int peer,
                  Tensors inputs, Tensors outputs, std::chrono::milliseconds timeout,
                  bool inputs_may_hold_outputs = false, bool started = false);
  // `by_this_thread`: the calling thread runs the op (it becomes the entry's thread); false for a
  // watcher that only saw the op start (an op on a CUDA stream keeps the thread that issued it).
  void started(const FrHandle& h, bool by_this_thread = true);
  // engine: "cpu", "cuda", "staged", "hierarchical"; algo and plan: what the engine ran. engine
  // and algo must be static strings (they are kept as pointers).
  void ran(const FrHandle& h, const char* engine, const char* algo, const std::string& plan);
  // error: empty when the op succeeded.
  void completed(const FrHandle& h, const char* error = nullptr);
  // The GPU's time between the events around the op's kernels (PYCOLL_FR_GPU_TIMING): a dump's
  // duration_ms then, instead of the host's started-to-completed time.
  void gpu_duration(const FrHandle& h, float ms);
  // PYCOLL_FR_GPU_TIMING, else TORCH_NCCL_ENABLE_TIMING, as read now.
  static bool gpu_timing_from_settings();

  // A phase of one CTA of an op's kernel (PYCOLL_CUDA_TRACE), in wall-clock ns: a dump's
  // "cta_phases" of the op, which `pycoll-trace timeline` shows as child slices. `event` names the
  // kernel's stamp that ends it (cuda/kernels/trace.cuh); -1: the CTA's whole run; -2: the CTA's run
  // so far, when it has no end stamp (still running, or stuck).
  struct CtaPhase {
    int32_t cta = 0;
    int32_t event = -1;
    int64_t start_ns = 0, end_ns = 0;
  };
  using Phases = std::map<uint64_t, std::vector<CtaPhase>>;  // by record id
  // Something that knows ops' kernel phases (a group's CUDA engine); asked at every dump, from the
  // dumping thread, so it must not block on an op. Returns an id for remove_phase_source, which
  // returns once no dump calls it any more.
  int add_phase_source(std::function<void(Phases&)> source);
  void remove_phase_source(int id);

  // The whole ring as torch's flight-recorder layout, in JSON (docs/tracing.md).
  std::string dump_json(const std::string& reason) const;
  // Writes dump_json to prefix + rank (prefix: the argument, else TORCH_FR_DUMP_TEMP_FILE, else
  // /tmp/pycoll_trace_rank_); returns the path. Throws if the file cannot be written.
  std::string dump_to_file(const std::string& prefix, const std::string& reason) const;
  // The prefix dump_to_file uses when given none.
  static std::string default_prefix();

 private:
  FlightRecorder();
  struct Tensor {
    int64_t sizes[kMaxDims];
    int8_t ndim;
    int8_t dtype;  // at::ScalarType
  };
  struct Entry {
    uint64_t record_id = 0;  // 0: an empty slot
    int32_t pg_id = 0;
    int32_t peer = -1;
    uint64_t op_id = 0, collective_seq = 0, p2p_seq = 0;
    const char* op = "";
    State state = State::Scheduled;
    bool was_started = false;  // started() saw it scheduled (counts for last_started_collective)
    bool failed = false;       // its error is in errors_ (failures are rare: the map stays small)
    int8_t n_in = 0, n_out = 0;
    Tensor in[kMaxTensors], out[kMaxTensors];
    int64_t created_ns = 0, started_ns = 0, completed_ns = 0;
    float gpu_ms = -1;  // gpu_duration(); -1: not measured
    int64_t timeout_ms = 0;
    uint64_t thread_id = 0;
    char thread_name[16] = {};
    const char* engine = "";  // static names (Engine::name(), algo_name())
    const char* algo = "";
    char plan[96] = {};
  };
  // One entry and its lock (0: free, 1: held), a cache line apart from its neighbours: the
  // caller records the next op while the engine thread updates this one.
  struct alignas(64) Slot {
    std::atomic<uint32_t> lock{0};
    Entry e;
  };
  struct SlotGuard;
  struct Group {
    std::string name, desc;  // under mu_
    std::vector<int64_t> ranks;
    // The highest collective seqs of this group's entries that the ring overwrote (a dump adds
    // those still in the ring): `done` those both started and completed (most: one update per
    // op), the other three those that were not (enqueued: any). last_started_collective is then
    // max(done, started), and so on.
    std::atomic<uint64_t> done{0}, enqueued{0}, started{0}, completed{0};
  };
  // Groups live in chunks that never move (chunk k holds 64 << k groups), so that a reader
  // needs no lock while add_group adds one.
  static constexpr int kGroupChunks = 26;
  Group* group(int pg_id) const;  // nullptr when pg_id names no group
  // Adds an overwritten (or never stored) entry's seqs to its group's maxima.
  void fold(int pg_id, uint64_t collective_seq, bool started, bool completed) const;
  Slot* live(const FrHandle& h);  // the handle's slot (not locked), or nullptr if not recorded

  size_t capacity_;
  std::unique_ptr<Slot[]> ring_;  // allocated once
  std::atomic<uint64_t> next_id_{1};
  std::atomic<Group*> group_chunks_[kGroupChunks] = {};
  std::atomic<int> n_groups_{0};
  mutable std::mutex mu_;  // groups' names and ranks, errors_, stacks_, the process rank; taken before a slot's lock
  std::map<uint64_t, std::string> errors_;  // record id -> error, for failed entries (pruned as the ring moves on)
  bool stacks_on_ = false;                  // PYCOLL_FR_STACKS
  std::map<uint64_t, std::shared_ptr<torch::CapturedTraceback>> stacks_;  // record id -> the caller's stack
  int process_rank_ = -1, world_size_ = 0;
  mutable std::mutex sources_mu_;  // the phase sources; held while a dump asks them
  std::map<int, std::function<void(Phases&)>> phase_sources_;
  int next_source_ = 0;
};

}  // namespace pycoll

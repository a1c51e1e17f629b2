#include "backend/flight_recorder.h"

#include <torch/csrc/profiler/combined_traceback.h>

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "common/check.h"
#include "common/setting.h"

namespace pycoll {

namespace {

const IntSetting kBufferSize("PYCOLL_FR_BUFFER_SIZE", 2000, 0, 10000000, "backend", false, Audience::User,
                             "Entries the flight recorder keeps (the most recent ops of every group of the "
                             "process; docs/tracing.md); 0 turns it off. Unset: TORCH_FR_BUFFER_SIZE, else 2000.",
                             "TORCH_FR_BUFFER_SIZE, else 2000");

const IntSetting kStacks("PYCOLL_FR_STACKS", 0, 0, 1, "backend", false, Audience::User,
                         "1: the flight recorder keeps each op's Python stack (the caller's file, function and "
                         "line in a dump's frames; docs/tracing.md). It costs microseconds per op, hence off.");

const IntSetting kGpuTiming("PYCOLL_FR_GPU_TIMING", 0, 0, 1, "backend", false, Audience::User,
                            "1: ops on CUDA streams are timed with timed events, so that a flight-recorder dump's "
                            "duration_ms is the GPU's time (docs/tracing.md); timed events cost more to record. "
                            "Unset: TORCH_NCCL_ENABLE_TIMING, else 0.",
                            "TORCH_NCCL_ENABLE_TIMING, else 0");

size_t buffer_size_from_settings() {
  if (kBufferSize.is_set()) return static_cast<size_t>(kBufferSize.get());
  if (const char* torch_size = std::getenv("TORCH_FR_BUFFER_SIZE")) {
    char* end = nullptr;
    const long long v = std::strtoll(torch_size, &end, 10);
    if (end != torch_size && *end == '\0' && v >= 0) return static_cast<size_t>(v);
  }
  return 2000;
}

// The calling thread's id and name, read once per thread (both are syscalls).
struct ThreadIdentity {
  uint64_t tid = 0;
  char name[16] = {};
};
const ThreadIdentity& this_thread_identity() {
  thread_local ThreadIdentity id = [] {
    ThreadIdentity t;
    t.tid = static_cast<uint64_t>(::syscall(SYS_gettid));
    pthread_getname_np(pthread_self(), t.name, sizeof(t.name));
    return t;
  }();
  return id;
}

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A JSON string literal of s.
void put_string(std::string& out, const char* s) {
  out += '"';
  for (const char* p = s; *p; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof(esc), "\\u%04x", c);
          out += esc;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}
void put_string(std::string& out, const std::string& s) { put_string(out, s.c_str()); }

std::string ranks_text(const std::vector<int64_t>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

const char* state_name(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::Scheduled: return "scheduled";
    case FlightRecorder::State::Started: return "started";
    case FlightRecorder::State::Completed: return "completed";
  }
  return "scheduled";
}

void put_time_or_null(std::string& out, int64_t ns) { out += ns > 0 ? std::to_string(ns) : std::string("null"); }

}  // namespace

FlightRecorder& FlightRecorder::get() {
  static FlightRecorder* recorder = new FlightRecorder();  // never destroyed: threads may record at exit
  return *recorder;
}

FlightRecorder::FlightRecorder()
    : capacity_(buffer_size_from_settings()),
      ring_(capacity_ > 0 ? new Slot[capacity_] : nullptr),
      stacks_on_(capacity_ > 0 && kStacks.get() == 1) {}

// Data races: an Entry is read or written only under its slot's lock (acquired by a
// compare-and-swap, released by a store: each holder sees the previous holder's writes); a
// group's name, description and ranks, errors_, stacks_ and the process rank only under mu_;
// next_id_, the groups' maxima, the chunk pointers and n_groups_ are atomics. Lock order: mu_,
// then one slot's lock (completed with an error, dump_json); the state updates take a slot's
// lock alone. A slot's lock is held for a few stores or one copy of an Entry, never across a
// call that can block, so a waiter spins briefly (yielding the CPU if the holder was preempted).
struct FlightRecorder::SlotGuard {
  std::atomic<uint32_t>& lock;
  explicit SlotGuard(Slot& s) : lock(s.lock) {
    for (int spins = 0;; ++spins) {
      uint32_t free = 0;
      if (lock.load(std::memory_order_relaxed) == 0 &&
          lock.compare_exchange_weak(free, 1, std::memory_order_acquire, std::memory_order_relaxed)) {
        return;
      }
      if (spins >= 64) {
        sched_yield();
      } else {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
      }
    }
  }
  ~SlotGuard() { lock.store(0, std::memory_order_release); }
  SlotGuard(const SlotGuard&) = delete;
  SlotGuard& operator=(const SlotGuard&) = delete;
};

FlightRecorder::Group* FlightRecorder::group(int pg_id) const {
  if (pg_id < 0 || pg_id >= n_groups_.load(std::memory_order_acquire)) return nullptr;
  // Group i is in chunk k = floor(log2(i / 64 + 1)), at i + 64 - (64 << k).
  const uint64_t v = static_cast<uint64_t>(pg_id) + 64;
  const int k = 63 - __builtin_clzll(v) - 6;
  return group_chunks_[k].load(std::memory_order_acquire) + (v - (uint64_t{64} << k));
}

namespace {
void raise_to(std::atomic<uint64_t>& max, uint64_t v) {
  uint64_t cur = max.load(std::memory_order_relaxed);
  while (v > cur && !max.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {}
}
}  // namespace

void FlightRecorder::fold(int pg_id, uint64_t collective_seq, bool started, bool completed) const {
  Group* grp = collective_seq > 0 ? group(pg_id) : nullptr;
  if (grp == nullptr) return;
  if (started && completed) {
    raise_to(grp->done, collective_seq);
    return;
  }
  raise_to(grp->enqueued, collective_seq);
  if (started) raise_to(grp->started, collective_seq);
  if (completed) raise_to(grp->completed, collective_seq);
}

int FlightRecorder::add_group(const std::string& name, const std::string& desc, const std::vector<int64_t>& ranks) {
  std::lock_guard<std::mutex> g(mu_);
  const int id = n_groups_.load(std::memory_order_relaxed);
  const uint64_t v = static_cast<uint64_t>(id) + 64;
  const int k = 63 - __builtin_clzll(v) - 6;
  TORCH_CHECK(k < kGroupChunks, "pycoll: flight recorder: too many groups");
  Group* chunk = group_chunks_[k].load(std::memory_order_relaxed);
  if (chunk == nullptr) {
    chunk = new Group[size_t{64} << k];  // kept for the process's life, as the recorder
    group_chunks_[k].store(chunk, std::memory_order_release);
  }
  Group& grp = chunk[v - (uint64_t{64} << k)];
  grp.name = name;
  grp.desc = desc;
  grp.ranks = ranks;
  n_groups_.store(id + 1, std::memory_order_release);
  return id;
}

void FlightRecorder::describe_group(int pg_id, const std::string& desc, const std::vector<int64_t>& ranks) {
  std::lock_guard<std::mutex> g(mu_);
  Group* grp = group(pg_id);
  if (grp == nullptr) return;
  if (!desc.empty()) grp->desc = desc;
  if (!ranks.empty()) grp->ranks = ranks;
}

void FlightRecorder::set_process_rank(int rank, int world_size) {
  std::lock_guard<std::mutex> g(mu_);
  process_rank_ = rank;
  world_size_ = world_size;
}

int FlightRecorder::process_rank() const {
  std::lock_guard<std::mutex> g(mu_);
  return process_rank_;
}

FrHandle FlightRecorder::record(int pg_id, uint64_t op_id, uint64_t collective_seq, uint64_t p2p_seq, const char* op,
                                int peer, Tensors inputs, Tensors outputs, std::chrono::milliseconds timeout,
                                bool inputs_may_hold_outputs, bool started) {
  if (capacity_ == 0) return {};
  // Everything read from the tensors before the slot's lock: the lock covers only the copy into the slot.
  Tensor in[kMaxTensors], out[kMaxTensors];
  const auto is_output = [&outputs](const at::Tensor& t) {
    for (size_t i = 0; i < outputs.size; ++i)
      if (outputs.data[i].is_same(t)) return true;
    return false;
  };
  const auto describe = [](Tensors ts, Tensor* dst, const auto& skip) {
    int8_t n = 0;
    for (size_t k = 0; k < ts.size && n < kMaxTensors; ++k) {
      const at::Tensor& t = ts.data[k];
      if (skip(t)) continue;
      Tensor& d = dst[n++];
      if (!t.defined()) {
        d.ndim = 0;
        d.dtype = static_cast<int8_t>(at::ScalarType::Undefined);
        continue;
      }
      const int64_t dims = t.dim();
      if (dims > kMaxDims) {
        d.ndim = 1;
        d.sizes[0] = t.numel();
      } else {
        d.ndim = static_cast<int8_t>(dims);
        for (int64_t i = 0; i < dims; ++i) d.sizes[i] = t.size(i);
      }
      d.dtype = static_cast<int8_t>(t.scalar_type());
    }
    return n;
  };
  const auto keep_all = [](const at::Tensor&) { return false; };
  int8_t n_in = inputs_may_hold_outputs ? describe(inputs, in, is_output) : describe(inputs, in, keep_all);
  if (n_in == 0 && inputs_may_hold_outputs) n_in = describe(outputs, in, keep_all);  // in place
  const int8_t n_out = describe(outputs, out, keep_all);
  const int64_t now = wall_ns();
  const ThreadIdentity& me = this_thread_identity();
  // Before any lock: gathering takes the GIL, which a thread waiting for a dump may hold.
  std::shared_ptr<torch::CapturedTraceback> stack =
      stacks_on_ ? torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false) : nullptr;

  const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  if (stacks_on_) {
    std::lock_guard<std::mutex> g(mu_);
    if (id > capacity_) stacks_.erase(stacks_.begin(), stacks_.upper_bound(id - capacity_));
    if (stack) stacks_.emplace(id, std::move(stack));
  }
  const auto slot = static_cast<int64_t>((id - 1) % capacity_);
  Slot& s = ring_[slot];
  SlotGuard g(s);
  Entry& e = s.e;
  if (e.record_id > id) {
    // Other threads recorded a whole ring of ops between this one's id and its store: the newer
    // op keeps the slot and this one counts only in its group's maxima (updates through its
    // handle find the slot taken, as for any overwritten entry).
    fold(pg_id, collective_seq, started, false);
    return FrHandle{slot, id, pg_id};
  }
  if (e.record_id != 0) {
    fold(e.pg_id, e.collective_seq, e.was_started, e.state == State::Completed);  // the entry it overwrites
  }
  e.record_id = id;
  e.pg_id = pg_id;
  e.peer = peer;
  e.op_id = op_id;
  e.collective_seq = collective_seq;
  e.p2p_seq = p2p_seq;
  e.op = op;
  e.state = started ? State::Started : State::Scheduled;
  e.was_started = started;
  e.failed = false;
  e.n_in = n_in;
  e.n_out = n_out;
  std::copy(in, in + n_in, e.in);
  std::copy(out, out + n_out, e.out);
  e.created_ns = now;
  e.started_ns = started ? now : 0;
  e.completed_ns = 0;
  e.gpu_ms = -1;
  e.timeout_ms = timeout.count();
  // The issuing thread until a thread that runs the op says otherwise (started()).
  e.thread_id = me.tid;
  std::memcpy(e.thread_name, me.name, sizeof(e.thread_name));
  e.plan[0] = '\0';
  e.engine = e.algo = "";
  return FrHandle{slot, id, pg_id};
}

FlightRecorder::Slot* FlightRecorder::live(const FrHandle& h) {
  return h.recorded() && capacity_ > 0 ? &ring_[h.slot] : nullptr;
}

void FlightRecorder::started(const FrHandle& h, bool by_this_thread) {
  Slot* s = live(h);
  if (s == nullptr) return;
  const int64_t now = wall_ns();
  const ThreadIdentity* me = by_this_thread ? &this_thread_identity() : nullptr;
  SlotGuard g(*s);
  Entry& e = s->e;
  if (e.record_id != h.record_id || e.state != State::Scheduled) return;
  e.state = State::Started;
  e.was_started = true;
  e.started_ns = now;
  if (me != nullptr) {
    e.thread_id = me->tid;
    std::memcpy(e.thread_name, me->name, sizeof(e.thread_name));
  }
}

void FlightRecorder::ran(const FrHandle& h, const char* engine, const char* algo, const std::string& plan) {
  Slot* s = live(h);
  if (s == nullptr) return;
  const size_t n = std::min(plan.size(), sizeof(Entry::plan) - 1);
  SlotGuard g(*s);
  Entry& e = s->e;
  if (e.record_id != h.record_id) return;
  e.engine = engine ? engine : "";
  e.algo = algo ? algo : "";
  std::memcpy(e.plan, plan.data(), n);
  e.plan[n] = '\0';
}

bool FlightRecorder::gpu_timing_from_settings() {
  if (kGpuTiming.is_set()) return kGpuTiming.get() != 0;
  const char* torch_timing = std::getenv("TORCH_NCCL_ENABLE_TIMING");
  return torch_timing != nullptr && std::strcmp(torch_timing, "1") == 0;
}

void FlightRecorder::gpu_duration(const FrHandle& h, float ms) {
  Slot* s = live(h);
  if (s == nullptr) return;
  SlotGuard g(*s);
  if (s->e.record_id == h.record_id) s->e.gpu_ms = ms;
}

void FlightRecorder::completed(const FrHandle& h, const char* error) {
  Slot* s = live(h);
  if (s == nullptr) return;
  const int64_t now = wall_ns();
  const auto complete = [now](Entry& e) {
    if (e.started_ns == 0) e.started_ns = now;
    e.state = State::Completed;
    e.completed_ns = now;
  };
  if (error == nullptr) {
    SlotGuard g(*s);
    if (s->e.record_id == h.record_id && s->e.state != State::Completed) complete(s->e);
    return;
  }
  // A failure: its error goes into errors_ while the slot is locked, so that a dump (which holds
  // mu_ while it copies the ring) sees a failed entry with its error.
  std::lock_guard<std::mutex> m(mu_);
  {
    SlotGuard g(*s);
    Entry& e = s->e;
    if (e.record_id != h.record_id || e.state == State::Completed) return;
    errors_[e.record_id] = error;
    e.failed = true;
    complete(e);
  }
  // The errors of entries the ring has overwritten (ids up to the newest's minus the capacity).
  const uint64_t newest = next_id_.load(std::memory_order_relaxed) - 1;
  if (newest > capacity_) errors_.erase(errors_.begin(), errors_.upper_bound(newest - capacity_));
}

int FlightRecorder::add_phase_source(std::function<void(Phases&)> source) {
  std::lock_guard<std::mutex> g(sources_mu_);
  phase_sources_[next_source_] = std::move(source);
  return next_source_++;
}

void FlightRecorder::remove_phase_source(int id) {
  std::lock_guard<std::mutex> g(sources_mu_);
  phase_sources_.erase(id);
}

std::string FlightRecorder::dump_json(const std::string& reason) const {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  // The kernel phases of traced ops (PYCOLL_CUDA_TRACE), asked before any lock of the ring.
  Phases phases;
  {
    std::lock_guard<std::mutex> g(sources_mu_);
    for (const auto& [id, source] : phase_sources_) source(phases);
  }
  // The stacks as frames, made before the lock (symbolizing takes the GIL): record id -> frames.
  std::map<uint64_t, std::string> frames;
  if (stacks_on_) {
    std::vector<std::pair<uint64_t, std::shared_ptr<torch::CapturedTraceback>>> kept;
    {
      std::lock_guard<std::mutex> g(mu_);
      kept.assign(stacks_.begin(), stacks_.end());
    }
    std::vector<torch::CapturedTraceback*> tbs;
    for (auto& [id, tb] : kept) tbs.push_back(tb.get());
    const torch::SymbolizedTracebacks sym = torch::symbolize(tbs);
    for (size_t i = 0; i < kept.size() && i < sym.tracebacks.size(); ++i) {
      std::string f = "[";
      for (size_t k = 0; k < sym.tracebacks[i].size(); ++k) {
        const auto& fr = sym.all_frames[sym.tracebacks[i][k]];
        f += k ? ", {\"name\": " : "{\"name\": ";
        put_string(f, fr.funcname);
        f += ", \"filename\": ";
        put_string(f, fr.filename);
        f += ", \"line\": " + std::to_string(fr.lineno) + "}";
      }
      frames[kept[i].first] = f + "]";
    }
  }
  // Under mu_ (so that no group is renamed and no error is added meanwhile); each entry copied
  // under its slot's lock, then written out.
  std::lock_guard<std::mutex> m(mu_);
  const int n_groups = n_groups_.load(std::memory_order_acquire);
  std::vector<uint64_t> enqueued(n_groups), started(n_groups), completed(n_groups);  // the pg_status maxima
  std::string entries;
  const auto put_tensors = [&entries](const Tensor* ts, int n, bool sizes) {
    std::string& out = entries;
    out += "[";
    for (int i = 0; i < n; ++i) {
      out += i ? ", " : "";
      if (sizes) {
        out += "[";
        for (int d = 0; d < ts[i].ndim; ++d) out += (d ? ", " : "") + std::to_string(ts[i].sizes[d]);
        out += "]";
      } else {
        const auto t = static_cast<at::ScalarType>(ts[i].dtype);
        put_string(out, t == at::ScalarType::Undefined ? "Undefined" : c10::toString(t));
      }
    }
    out += "]";
  };
  const auto put_entry = [&](const Entry& e) {
    std::string& out = entries;
    const Group* grp = group(e.pg_id);
    if (grp != nullptr && e.collective_seq > 0) {
      enqueued[e.pg_id] = std::max(enqueued[e.pg_id], e.collective_seq);
      if (e.was_started) started[e.pg_id] = std::max(started[e.pg_id], e.collective_seq);
      if (e.state == State::Completed) completed[e.pg_id] = std::max(completed[e.pg_id], e.collective_seq);
    }
    out += out.empty() ? "\n" : ",\n";
    out += "{\"record_id\": " + std::to_string(e.record_id) + ", \"pg_id\": " + std::to_string(e.pg_id) +
           ", \"process_group\": [";
    put_string(out, grp ? grp->name : std::string());
    out += ", ";
    put_string(out, grp ? grp->desc : std::string());
    const bool p2p = e.p2p_seq > 0;
    out += "], \"collective_seq_id\": " + std::to_string(e.collective_seq) +
           ", \"p2p_seq_id\": " + std::to_string(e.p2p_seq) + ", \"op_id\": " + std::to_string(e.op_id) +
           ", \"is_p2p\": " + (p2p ? "true" : "false") + ", \"profiling_name\": ";
    put_string(out, std::string("pycoll:") + e.op);
    out += ", \"input_sizes\": ";
    put_tensors(e.in, e.n_in, true);
    out += ", \"input_dtypes\": ";
    put_tensors(e.in, e.n_in, false);
    out += ", \"output_sizes\": ";
    put_tensors(e.out, e.n_out, true);
    out += ", \"output_dtypes\": ";
    put_tensors(e.out, e.n_out, false);
    out += ", \"state\": ";
    put_string(out, state_name(e.state));
    out += ", \"time_created_ns\": " + std::to_string(e.created_ns) + ", \"time_discovered_started_ns\": ";
    put_time_or_null(out, e.started_ns);
    out += ", \"time_discovered_completed_ns\": ";
    put_time_or_null(out, e.completed_ns);
    out += ", \"duration_ms\": ";
    if (e.gpu_ms >= 0) {
      char ms[32];
      std::snprintf(ms, sizeof(ms), "%.6f", static_cast<double>(e.gpu_ms));
      out += ms;
    } else if (e.completed_ns > 0 && e.started_ns > 0) {
      char ms[32];
      std::snprintf(ms, sizeof(ms), "%.6f", static_cast<double>(e.completed_ns - e.started_ns) / 1e6);
      out += ms;
    } else {
      out += "null";
    }
    out += ", \"timeout_ms\": " + std::to_string(e.timeout_ms) +
           ", \"retired\": " + (e.state == State::Completed ? "true" : "false") + ", \"thread_id\": ";
    put_string(out, std::to_string(e.thread_id));
    out += ", \"thread_name\": ";
    put_string(out, e.thread_name);
    const auto stack = frames.find(e.record_id);
    out += ", \"frames\": " + (stack != frames.end() ? stack->second : std::string("[]")) +
           ", \"peer\": " + std::to_string(e.peer) + ", \"engine\": ";
    put_string(out, e.engine);
    out += ", \"algorithm\": ";
    put_string(out, e.algo);
    out += ", \"plan\": ";
    put_string(out, e.plan);
    out += ", \"error\": ";
    const auto err = e.failed ? errors_.find(e.record_id) : errors_.end();
    put_string(out, err != errors_.end() ? err->second : std::string());
    if (const auto ph = phases.find(e.record_id); ph != phases.end()) {
      out += ", \"cta_phases\": [";
      for (size_t i = 0; i < ph->second.size(); ++i) {
        const CtaPhase& p = ph->second[i];
        out += std::string(i ? ", " : "") + "{\"cta\": " + std::to_string(p.cta) + ", \"name\": \"" +
               (p.event == -1   ? std::string("kernel")
                : p.event == -2 ? std::string("kernel (not ended)")
                                : "to event " + std::to_string(p.event)) +
               "\", \"start_ns\": " + std::to_string(p.start_ns) + ", \"end_ns\": " + std::to_string(p.end_ns) + "}";
      }
      out += "]";
    }
    out += "}";
  };
  // Oldest first: from the slot after the newest, around the ring. A slot that ops recorded
  // meanwhile gave to a newer op is written after the others (its record id is above them all).
  const uint64_t total = next_id_.load(std::memory_order_acquire) - 1;
  const uint64_t first = total > capacity_ ? total - capacity_ + 1 : 1;
  entries.reserve(700 * std::min<uint64_t>(capacity_, total));
  std::vector<Entry> newer;
  Entry e;
  for (uint64_t id = first; id <= total && capacity_ > 0; ++id) {
    Slot& s = ring_[(id - 1) % capacity_];
    {
      SlotGuard g(s);
      e = s.e;
    }
    if (e.record_id == id) put_entry(e);
    if (e.record_id > id) newer.push_back(e);
  }
  std::sort(newer.begin(), newer.end(), [](const Entry& a, const Entry& b) { return a.record_id < b.record_id; });
  for (const Entry& n : newer) put_entry(n);
  // The maxima of the entries the ring overwrote, read after the copy: an entry overwritten
  // while the ring was copied is in one or the other.
  for (int i = 0; i < n_groups; ++i) {
    const Group* grp = group(i);
    const uint64_t done = grp->done.load(std::memory_order_relaxed);
    enqueued[i] = std::max({enqueued[i], done, grp->enqueued.load(std::memory_order_relaxed)});
    started[i] = std::max({started[i], done, grp->started.load(std::memory_order_relaxed)});
    completed[i] = std::max({completed[i], done, grp->completed.load(std::memory_order_relaxed)});
  }
  std::string out;
  out.reserve(512 + 200 * n_groups + entries.size());
  out += "{\"version\": \"2.10\", \"backend\": \"pycoll\", \"rank\": " + std::to_string(process_rank_) +
         ", \"world_size\": " + std::to_string(world_size_) + ", \"hostname\": ";
  put_string(out, host);
  out += ", \"pid\": " + std::to_string(::getpid()) + ", \"dump_reason\": ";
  put_string(out, reason);
  out += ", \"dump_time_ns\": " + std::to_string(wall_ns()) + ",\n\"pg_config\": {";
  for (int i = 0; i < n_groups; ++i) {
    const Group& grp = *group(i);
    out += i ? ", " : "";
    put_string(out, grp.name);
    out += ": {\"name\": ";
    put_string(out, grp.name);
    out += ", \"desc\": ";
    put_string(out, grp.desc);
    out += ", \"ranks\": ";
    put_string(out, ranks_text(grp.ranks));
    out += "}";
  }
  out += "},\n\"pg_status\": {";
  for (int i = 0; i < n_groups; ++i) {
    out += i ? ", " : "";
    put_string(out, group(i)->name);
    out += ": {\"last_enqueued_collective\": " + std::to_string(enqueued[i]) +
           ", \"last_started_collective\": " + std::to_string(started[i]) +
           ", \"last_completed_collective\": " + std::to_string(completed[i]) + "}";
  }
  out += "},\n\"entries\": [";
  out += entries;
  out += "\n]}\n";
  return out;
}

std::string FlightRecorder::default_prefix() {
  const char* torch_prefix = std::getenv("TORCH_FR_DUMP_TEMP_FILE");
  return torch_prefix && *torch_prefix ? torch_prefix : "/tmp/pycoll_trace_rank_";
}

std::string FlightRecorder::dump_to_file(const std::string& prefix, const std::string& reason) const {
  const std::string path = (prefix.empty() ? default_prefix() : prefix) + std::to_string(std::max(process_rank(), 0));
  const std::string text = dump_json(reason);
  // Written beside and renamed: a reader never sees half a dump.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TORCH_CHECK(f.good(), "pycoll: flight recorder: cannot write ", tmp, ": ", std::strerror(errno));
    f << text;
    f.close();
    TORCH_CHECK(f.good(), "pycoll: flight recorder: writing ", tmp, " failed: ", std::strerror(errno));
  }
  TORCH_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "pycoll: flight recorder: cannot rename ", tmp, " to ", path,
              ": ", std::strerror(errno));
  return path;
}

}  // namespace pycoll

#include "backend/flight_recorder.h"

#include <torch/csrc/profiler/combined_traceback.h>

#include <pthread.h>
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
    : capacity_(buffer_size_from_settings()), ring_(capacity_), stacks_on_(capacity_ > 0 && kStacks.get() == 1) {}

int FlightRecorder::add_group(const std::string& name, const std::string& desc, const std::vector<int64_t>& ranks) {
  std::lock_guard<std::mutex> g(mu_);
  groups_.push_back(Group{name, desc, ranks});
  return static_cast<int>(groups_.size()) - 1;
}

void FlightRecorder::describe_group(int pg_id, const std::string& desc, const std::vector<int64_t>& ranks) {
  std::lock_guard<std::mutex> g(mu_);
  if (pg_id < 0 || pg_id >= static_cast<int>(groups_.size())) return;
  if (!desc.empty()) groups_[pg_id].desc = desc;
  if (!ranks.empty()) groups_[pg_id].ranks = ranks;
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
                                bool inputs_may_hold_outputs) {
  if (capacity_ == 0) return {};
  // Everything read from the tensors before the lock: the lock covers only the copy into the slot.
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
  const uint64_t tid = this_thread_identity().tid;
  // Outside the lock: gathering takes the GIL, which a thread waiting for a dump may hold.
  std::shared_ptr<torch::CapturedTraceback> stack =
      stacks_on_ ? torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false) : nullptr;

  std::lock_guard<std::mutex> g(mu_);
  const uint64_t id = next_id_++;
  if (stacks_on_) {
    if (id > capacity_) stacks_.erase(stacks_.begin(), stacks_.upper_bound(id - capacity_));
    if (stack) stacks_.emplace(id, std::move(stack));
  }
  const auto slot = static_cast<int64_t>((id - 1) % capacity_);
  Entry& e = ring_[slot];
  e.record_id = id;
  e.pg_id = pg_id;
  e.peer = peer;
  e.op_id = op_id;
  e.collective_seq = collective_seq;
  e.p2p_seq = p2p_seq;
  e.op = op;
  e.state = State::Scheduled;
  e.n_in = n_in;
  e.n_out = n_out;
  std::copy(in, in + n_in, e.in);
  std::copy(out, out + n_out, e.out);
  e.created_ns = now;
  e.started_ns = e.completed_ns = 0;
  e.timeout_ms = timeout.count();
  e.thread_id = tid;
  e.thread_name[0] = e.plan[0] = '\0';
  e.engine = e.algo = "";
  if (e.failed) errors_.erase(id - capacity_);  // the error of the entry this slot held
  e.failed = false;
  if (pg_id >= 0 && pg_id < static_cast<int>(groups_.size()) && collective_seq > 0) {
    groups_[pg_id].last_enqueued = std::max(groups_[pg_id].last_enqueued, collective_seq);
  }
  return FrHandle{slot, id, pg_id};
}

FlightRecorder::Entry* FlightRecorder::live(const FrHandle& h) {
  if (!h.recorded()) return nullptr;
  Entry& e = ring_[h.slot];
  return e.record_id == h.record_id ? &e : nullptr;
}

void FlightRecorder::started(const FrHandle& h) {
  if (!h.recorded()) return;
  const int64_t now = wall_ns();
  const ThreadIdentity& me = this_thread_identity();
  std::lock_guard<std::mutex> g(mu_);
  Entry* e = live(h);
  if (e == nullptr || e->state != State::Scheduled) return;
  e->state = State::Started;
  e->started_ns = now;
  e->thread_id = me.tid;
  std::memcpy(e->thread_name, me.name, sizeof(e->thread_name));
  if (e->collective_seq > 0 && e->pg_id < static_cast<int>(groups_.size())) {
    Group& grp = groups_[e->pg_id];
    grp.last_started = std::max(grp.last_started, e->collective_seq);
  }
}

void FlightRecorder::ran(const FrHandle& h, const char* engine, const char* algo, const std::string& plan) {
  if (!h.recorded()) return;
  std::lock_guard<std::mutex> g(mu_);
  Entry* e = live(h);
  if (e == nullptr) return;
  e->engine = engine ? engine : "";
  e->algo = algo ? algo : "";
  const size_t n = std::min(plan.size(), sizeof(e->plan) - 1);
  std::memcpy(e->plan, plan.data(), n);
  e->plan[n] = '\0';
}

void FlightRecorder::completed(const FrHandle& h, const char* error) {
  if (!h.recorded()) return;
  const int64_t now = wall_ns();
  std::lock_guard<std::mutex> g(mu_);
  Entry* e = live(h);
  if (e == nullptr || e->state == State::Completed) return;
  if (e->started_ns == 0) e->started_ns = now;
  e->state = State::Completed;
  e->completed_ns = now;
  if (error != nullptr) {
    e->failed = true;
    errors_[e->record_id] = error;
  }
  if (e->collective_seq > 0 && e->pg_id < static_cast<int>(groups_.size())) {
    Group& grp = groups_[e->pg_id];
    grp.last_completed = std::max(grp.last_completed, e->collective_seq);
  }
}

std::string FlightRecorder::dump_json(const std::string& reason) const {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
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
  std::lock_guard<std::mutex> g(mu_);
  std::string out;
  out.reserve(512 + 700 * std::min<size_t>(capacity_, next_id_));
  out += "{\"version\": \"2.10\", \"backend\": \"pycoll\", \"rank\": " + std::to_string(process_rank_) +
         ", \"world_size\": " + std::to_string(world_size_) + ", \"hostname\": ";
  put_string(out, host);
  out += ", \"pid\": " + std::to_string(::getpid()) + ", \"dump_reason\": ";
  put_string(out, reason);
  out += ", \"dump_time_ns\": " + std::to_string(wall_ns()) + ",\n\"pg_config\": {";
  for (size_t i = 0; i < groups_.size(); ++i) {
    const Group& grp = groups_[i];
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
  for (size_t i = 0; i < groups_.size(); ++i) {
    const Group& grp = groups_[i];
    out += i ? ", " : "";
    put_string(out, grp.name);
    out += ": {\"last_enqueued_collective\": " + std::to_string(grp.last_enqueued) +
           ", \"last_started_collective\": " + std::to_string(grp.last_started) +
           ", \"last_completed_collective\": " + std::to_string(grp.last_completed) + "}";
  }
  out += "},\n\"entries\": [";
  // Oldest first: the slot after the newest, around the ring.
  const uint64_t total = next_id_ - 1;
  const uint64_t first = total > capacity_ ? total - capacity_ + 1 : 1;
  bool any = false;
  const auto put_tensors = [&out](const Tensor* ts, int n, bool sizes) {
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
  for (uint64_t id = first; id <= total && capacity_ > 0; ++id) {
    const Entry& e = ring_[(id - 1) % capacity_];
    if (e.record_id != id) continue;
    const Group* grp = e.pg_id >= 0 && e.pg_id < static_cast<int>(groups_.size()) ? &groups_[e.pg_id] : nullptr;
    out += any ? ",\n" : "\n";
    any = true;
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
    if (e.completed_ns > 0 && e.started_ns > 0) {
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
    out += "}";
  }
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

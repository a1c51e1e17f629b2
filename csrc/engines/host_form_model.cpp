#include "engines/host_form_model.h"

#include <algorithm>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace pycoll {

namespace {

// Built-in thresholds (all_reduce and reduce_scatter: input bytes; all_gather: output bytes),
// measured as 2 simulated hosts x 2 GPUs: below these NCCL's one flat call beats the phases.
// docs/decisions/0029-hierarchical-engine-sizes-and-call-costs.md; a calibration (decision 0014)
// replaces them for its card and layout.
constexpr int64_t kDeviceAllReduceMinBytes = 128 << 10;
constexpr int64_t kDeviceReduceScatterMinBytes = 32 << 10;
constexpr int64_t kDeviceAllGatherMinBytes = 512 << 10;

std::mutex mu;
std::vector<HostFormTable> tables;  // sorted by key(), one per key

auto key(const HostFormTable& t) {
  return std::make_tuple(t.on_device, static_cast<int>(t.op), t.num_hosts, t.local_size);
}

}  // namespace

const char* host_form_name(HostForm f) { return f == HostForm::Flat ? "flat" : "hierarchical"; }

HostForm parse_host_form(const std::string& name) {
  if (name == "flat") return HostForm::Flat;
  if (name == "hierarchical") return HostForm::Hierarchical;
  throw std::invalid_argument("unknown form across hosts '" + name + "' (expected flat or hierarchical)");
}

void set_host_form_table(const HostFormTable& t) {
  if (t.op != OpCode::AllReduce && t.op != OpCode::ReduceScatter && t.op != OpCode::AllGather)
    throw std::invalid_argument(std::string("the form across hosts is chosen for all_reduce, reduce_scatter and "
                                            "all_gather only, not ") +
                                op_name(t.op));
  if (t.num_hosts < 2 || t.local_size < 2)
    throw std::invalid_argument("a form across hosts needs at least 2 hosts of at least 2 ranks; got " +
                                std::to_string(t.num_hosts) + " x " + std::to_string(t.local_size));
  if (t.steps.empty()) throw std::invalid_argument("a table of forms across hosts needs at least one step");
  for (size_t i = 0; i < t.steps.size(); ++i) {
    if (t.steps[i].from_bytes < 0 || (i > 0 && t.steps[i].from_bytes <= t.steps[i - 1].from_bytes))
      throw std::invalid_argument(
          "the steps of a table of forms across hosts must start at increasing, "
          "non-negative sizes");
  }
  if (t.max_bytes < t.steps.back().from_bytes)
    throw std::invalid_argument("max_bytes of a table of forms across hosts is below its last step");
  std::lock_guard<std::mutex> g(mu);
  auto it = std::find_if(tables.begin(), tables.end(), [&](const HostFormTable& x) { return key(x) == key(t); });
  if (it != tables.end()) {
    *it = t;
  } else {
    tables.push_back(t);
    std::sort(tables.begin(), tables.end(),
              [](const HostFormTable& a, const HostFormTable& b) { return key(a) < key(b); });
  }
}

void clear_host_form_tables() {
  std::lock_guard<std::mutex> g(mu);
  tables.clear();
}

std::vector<HostFormTable> host_form_tables() {
  std::lock_guard<std::mutex> g(mu);
  return tables;
}

std::optional<HostForm> calibrated_host_form(bool on_device, OpCode op, int num_hosts, int local_size, int64_t bytes) {
  std::lock_guard<std::mutex> g(mu);
  for (const HostFormTable& t : tables) {
    if (t.on_device != on_device || t.op != op || t.num_hosts != num_hosts || t.local_size != local_size) continue;
    if (bytes < t.steps.front().from_bytes || bytes > t.max_bytes) return std::nullopt;
    HostForm form = t.steps.front().form;
    for (const HostFormStep& s : t.steps)
      if (s.from_bytes <= bytes) form = s.form;
    return form;
  }
  return std::nullopt;
}

HostForm builtin_host_form(bool on_device, OpCode op, int64_t bytes) {
  if (!on_device) return HostForm::Hierarchical;
  int64_t min_bytes = 0;
  switch (op) {
    case OpCode::AllReduce: min_bytes = kDeviceAllReduceMinBytes; break;
    case OpCode::ReduceScatter: min_bytes = kDeviceReduceScatterMinBytes; break;
    case OpCode::AllGather: min_bytes = kDeviceAllGatherMinBytes; break;
    default: return HostForm::Flat;
  }
  return bytes < min_bytes ? HostForm::Flat : HostForm::Hierarchical;
}

HostForm choose_host_form(bool on_device, OpCode op, int num_hosts, int local_size, int64_t bytes) {
  if (auto f = calibrated_host_form(on_device, op, num_hosts, local_size, bytes)) return *f;
  return builtin_host_form(on_device, op, bytes);
}

std::string host_form_digest() {
  std::lock_guard<std::mutex> g(mu);
  std::ostringstream s;
  for (const HostFormTable& t : tables) {
    s << (t.on_device ? "cuda " : "cpu ") << op_name(t.op) << ' ' << t.num_hosts << 'x' << t.local_size << ':';
    for (const HostFormStep& st : t.steps) s << ' ' << host_form_name(st.form) << '@' << st.from_bytes;
    s << " ..." << t.max_bytes << ';';
  }
  return s.str();
}

}  // namespace pycoll

#include "engines/host_form_model.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace pycoll {

namespace {

std::mutex mu;
std::vector<HostFormEntry> entries;  // sorted by key(), one per key

auto key(const HostFormEntry& e) {
  return std::make_tuple(e.on_device, static_cast<int>(e.op), e.num_hosts, e.local_size, static_cast<int>(e.form));
}

const HostFormEntry* find(bool on_device, OpCode op, int num_hosts, int local_size, HostForm form) {
  for (const HostFormEntry& e : entries)
    if (e.on_device == on_device && e.op == op && e.num_hosts == num_hosts && e.local_size == local_size &&
        e.form == form)
      return &e;
  return nullptr;
}

}  // namespace

const char* host_form_name(HostForm f) { return f == HostForm::Flat ? "flat" : "hierarchical"; }

HostForm parse_host_form(const std::string& name) {
  if (name == "flat") return HostForm::Flat;
  if (name == "hierarchical") return HostForm::Hierarchical;
  throw std::invalid_argument("unknown form across hosts '" + name + "' (expected flat or hierarchical)");
}

void set_host_form_entry(const HostFormEntry& e) {
  if (e.op != OpCode::AllReduce && e.op != OpCode::ReduceScatter && e.op != OpCode::AllGather)
    throw std::invalid_argument(std::string("the form across hosts is chosen for all_reduce, reduce_scatter and "
                                            "all_gather only, not ") + op_name(e.op));
  if (e.num_hosts < 2 || e.local_size < 2)
    throw std::invalid_argument("a form across hosts needs at least 2 hosts of at least 2 ranks; got " +
                                std::to_string(e.num_hosts) + " x " + std::to_string(e.local_size));
  if (!std::isfinite(e.alpha_us) || !std::isfinite(e.beta_us_per_byte) || e.alpha_us < 0 || e.beta_us_per_byte < 0)
    throw std::invalid_argument("the constants of a form across hosts must be finite and non-negative");
  std::lock_guard<std::mutex> g(mu);
  auto it = std::find_if(entries.begin(), entries.end(), [&](const HostFormEntry& x) { return key(x) == key(e); });
  if (it != entries.end()) {
    *it = e;
  } else {
    entries.push_back(e);
    std::sort(entries.begin(), entries.end(), [](const HostFormEntry& a, const HostFormEntry& b) { return key(a) < key(b); });
  }
}

void clear_host_form_entries() {
  std::lock_guard<std::mutex> g(mu);
  entries.clear();
}

std::vector<HostFormEntry> host_form_entries() {
  std::lock_guard<std::mutex> g(mu);
  return entries;
}

std::optional<HostForm> calibrated_host_form(bool on_device, OpCode op, int num_hosts, int local_size, int64_t bytes) {
  std::lock_guard<std::mutex> g(mu);
  if (entries.empty()) return std::nullopt;
  const HostFormEntry* flat = find(on_device, op, num_hosts, local_size, HostForm::Flat);
  const HostFormEntry* hier = find(on_device, op, num_hosts, local_size, HostForm::Hierarchical);
  if (!flat || !hier) return std::nullopt;
  const double b = static_cast<double>(bytes);
  const double t_flat = flat->alpha_us + flat->beta_us_per_byte * b;
  const double t_hier = hier->alpha_us + hier->beta_us_per_byte * b;
  return t_hier <= t_flat ? HostForm::Hierarchical : HostForm::Flat;
}

std::string host_form_digest() {
  std::lock_guard<std::mutex> g(mu);
  std::ostringstream s;
  s.precision(17);  // the exact doubles: ranks that round alike but differ could still choose apart
  for (const HostFormEntry& e : entries)
    s << (e.on_device ? "cuda " : "cpu ") << op_name(e.op) << ' ' << e.num_hosts << 'x' << e.local_size << ' '
      << host_form_name(e.form) << ' ' << e.alpha_us << ' ' << e.beta_us_per_byte << ';';
  return s.str();
}

}  // namespace pycoll

// Which form a group across hosts runs a collective in, as calibrated on this machine:
// `pycoll-bench --hosts N --calibrate` times the flat form (every rank on the inter-host engine)
// and the hierarchical one (engines/hierarchical_engine.h) at every size and fits
// time_us = alpha_us + beta_us_per_byte * bytes to each (pycollectives/bench/calibrate.py:
// fit_host_forms); pycollectives.load_cost_model() installs the constants here at import. `auto`
// then runs the form the constants predict cheaper; without a pair of constants for the op, the
// device and the layout (hosts x ranks per host), the engine's built-in size rules decide.
// Process-wide, plain C++. Every rank of a group must hold the same constants (a form that
// differs between ranks would deadlock): pycollectives/hosts.py compares host_form_digest()
// across the ranks when a group across hosts is made.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/types.h"

namespace pycoll {

enum class HostForm : int32_t { Flat = 0, Hierarchical = 1 };

struct HostFormEntry {
  bool on_device = false;  // CUDA tensors (NCCL between hosts) or CPU tensors (Gloo)
  OpCode op = OpCode::AllReduce;
  HostForm form = HostForm::Flat;
  int num_hosts = 0;
  int local_size = 0;  // ranks per host
  double alpha_us = 0;
  double beta_us_per_byte = 0;  // per byte of the op's largest buffer, as pycoll-bench counts
};

// Adds or replaces the entry of (on_device, op, form, num_hosts, local_size). Throws
// std::invalid_argument for an op without a form choice (all_reduce, reduce_scatter and
// all_gather have one), a layout that has none (fewer than 2 hosts or 2 ranks per host), or
// negative or non-finite constants.
void set_host_form_entry(const HostFormEntry& e);
void clear_host_form_entries();
std::vector<HostFormEntry> host_form_entries();

// The cheaper form for `bytes` by the installed constants, or nothing when the flat and the
// hierarchical entry of (on_device, op, layout) are not both installed. Ties go to hierarchical.
std::optional<HostForm> calibrated_host_form(bool on_device, OpCode op, int num_hosts, int local_size, int64_t bytes);

// Every installed entry in a fixed order ("" when none): what the ranks of a group compare.
std::string host_form_digest();

const char* host_form_name(HostForm f);
HostForm parse_host_form(const std::string& name);  // "flat" or "hierarchical"

}  // namespace pycoll

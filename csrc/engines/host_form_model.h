// Which form a group across hosts runs a collective in: flat (every rank on the inter-host engine)
// or hierarchical (engines/hierarchical_engine.h). `auto` asks choose_host_form():
//  - calibrated: `pycoll-bench --hosts N --calibrate` times both forms at every size and writes,
//    per (device, op, layout), which form won where (pycollectives/bench/calibrate.py:
//    fit_host_forms); pycollectives.load_cost_model() installs the table here at import. Inside
//    the measured sizes the table decides;
//  - built in, elsewhere: hierarchical, except CUDA all_reduce below 128 KiB, CUDA reduce_scatter
//    below 32 KiB and CUDA all_gather below 512 KiB of output, which run as NCCL's one flat call.
// Process-wide, plain C++. Every rank of a group must hold the same tables (a form that differs
// between ranks would leave them waiting in different sub-groups): pycollectives/hosts.py
// compares host_form_digest() across the ranks when a group across hosts is made.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/types.h"

namespace pycoll {

enum class HostForm : int32_t { Flat = 0, Hierarchical = 1 };

// From `from_bytes` on (up to the next step), `form` won. Bytes as pycoll-bench counts them: the
// op's largest buffer (all_reduce: the tensor; reduce_scatter: the input; all_gather: the output).
struct HostFormStep {
  int64_t from_bytes = 0;
  HostForm form = HostForm::Hierarchical;
};

struct HostFormTable {
  bool on_device = false;  // CUDA tensors (NCCL between hosts) or CPU tensors (Gloo)
  OpCode op = OpCode::AllReduce;
  int num_hosts = 0;
  int local_size = 0;               // ranks per host
  std::vector<HostFormStep> steps;  // increasing from_bytes
  int64_t max_bytes = 0;            // the largest size measured: the table covers [steps[0], max_bytes]
};

// Adds or replaces the table of (on_device, op, num_hosts, local_size). Throws
// std::invalid_argument for an op without a form choice (all_reduce, reduce_scatter and
// all_gather have one), a layout that has none (fewer than 2 hosts or 2 ranks per host), or an
// empty, unsorted or out-of-range table.
void set_host_form_table(const HostFormTable& t);
void clear_host_form_tables();
std::vector<HostFormTable> host_form_tables();

// The table's form for `bytes`, or nothing (no table for the op, the device and the layout, or
// `bytes` outside it).
std::optional<HostForm> calibrated_host_form(bool on_device, OpCode op, int num_hosts, int local_size, int64_t bytes);
// The rule without a table.
HostForm builtin_host_form(bool on_device, OpCode op, int64_t bytes);
// The calibrated form where there is one, else the built-in one.
HostForm choose_host_form(bool on_device, OpCode op, int num_hosts, int local_size, int64_t bytes);

// Every installed table in a fixed order ("" when none): what the ranks of a group compare.
std::string host_form_digest();

const char* host_form_name(HostForm f);
HostForm parse_host_form(const std::string& name);  // "flat" or "hierarchical"

}  // namespace pycoll

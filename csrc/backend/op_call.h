// One backend call on its way to an engine: what every entry point builds after its argument
// checks, and what the one runner (ProcessGroupPycoll::run) takes from there: sequence number,
// Work, engine choice, pre-scale, the engine calls, write-back, stats and log.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <functional>
#include <vector>

#include "backend/flight_recorder.h"
#include "common/types.h"
#include "engines/engine.h"

namespace pycoll {

struct OpCall {
  c10d::OpType type = c10d::OpType::UNKNOWN;
  OpCode op = OpCode::AllReduce;  // the engine op every part runs
  const char* name = "";          // "pycoll::allreduce": the prefix of every message about this call
  const char* stats_name = "";    // its key in pycollectives.stats() and the debug log (a string literal)
  bool async = false;
  // The user's forced algorithm (pycollectives.set_algo) or Auto, read when the op is issued, so
  // that a set_algo() between issue and run cannot make ranks run one op differently.
  Algo algo = Algo::Auto;
  std::string schedule;  // algo Schedule: the program's name
  at::Device device{at::kCPU};
  at::ScalarType dtype = at::kFloat;
  // PREMUL_SUM: the runner multiplies each part's input by this factor and runs SUM (as NCCL).
  at::Tensor premul_factor;
  std::vector<at::Tensor> tensors;  // every user tensor the op reads or writes (kept alive)
  std::vector<at::Tensor> outputs;  // what the Work's Future holds
  // The simple form, used when prepare is empty: one engine call on the user's own tensors. The
  // runner makes them dense where they are not (an in-place call stays in place) and, when
  // write_back is set, copies the dense output back into the user's tensor.
  Collective direct;
  bool write_back = true;
  // The general form (lists, coalesced calls). Builds the engine calls from the user's tensors: flat dense views, or copies when the user's
  // tensors are not contiguous or come as lists. Runs where the op runs (after the caller's
  // stream), so copies made here are ordered like the op.
  std::function<std::vector<Collective>()> prepare;
  // Puts results back into the user's tensors when prepare made copies (may be empty).
  std::function<void(const std::vector<Collective>&)> finish;
  // Payload bytes this rank contributes, for the stats and the debug log.
  int64_t logged_bytes = 0;
  // What the engines' takes() weigh, alike on every rank, where the outputs are not alike (a
  // reduce_scatter of a list of uneven inputs: each rank's output is its own size); -1: the outputs.
  int64_t weighed_bytes = -1;
  // Its flight-recorder entry (set by the runner).
  FrHandle fr;
};

}  // namespace pycoll

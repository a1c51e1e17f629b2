// The engine interface: what the backend asks of every engine, at tensor level.
//
// Terms
//   collective  one call of one op on flat, contiguous tensors (struct Collective); the backend
//               has already checked the arguments, made the tensors dense and turned PREMUL_SUM
//               into a pre-scale + SUM, so an engine sees only what it runs.
//   stream      where the engine runs it: a CUDA stream for an engine of CUDA tensors (the
//               caller's or the group's communication stream, chosen by the backend), the CPU
//               stream for a CPU engine (which runs to completion before returning).
//
// An engine serves the ranks of one communicator: today the whole group; an engine over a
// subset of the group's ranks (one host's ranks, under a hierarchical engine) sees only its own
// rank and size. Each engine says which ops and dtypes it runs (serves); the backend asks and
// picks the next engine when the answer is no; it never compiles engines in or out by #ifdef.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"

namespace pycoll {

// All-to-all as bytes: what this rank sends to and receives from each peer, at which offset.
struct ByteSplits {
  std::vector<int64_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
};

struct Collective {
  OpCode op = OpCode::AllReduce;
  at::Tensor input;                     // contiguous; may be the same tensor as output (all_reduce, reduce, broadcast)
  at::Tensor output;                    // contiguous; undefined where this rank receives nothing (gather off the root)
  ReduceKind reduce = ReduceKind::Sum;  // never PremulSum (the backend pre-scales)
  int root = 0;                         // broadcast, reduce, gather, scatter
  Algo algo = Algo::Auto;               // the user's request; Auto asks the engine's cost model
  std::string schedule;                 // algo Schedule: the program's name (cpu/schedule_program.h)
  ByteSplits splits;                    // all_to_all
  // Where given (PYCOLL_DEBUG=INFO), the engine describes the launch it planned ("twoshot ll128
  // grid=32 ..."), so that the log names what ran; engines with nothing to add leave it empty.
  std::string* plan_text = nullptr;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const char* name() const = 0;
  // True when this engine runs `op` on tensors of `dtype` on `device`.
  virtual bool serves(OpCode op, at::ScalarType dtype, const at::Device& device) = 0;
  // Asked after serves(): false where this engine leaves this call to the next engine that serves
  // it (the staged one): ranks sharing one GPU stage small messages and schedule programs.
  // `bytes`: the op's output bytes, alike on every rank, so every rank answers alike.
  virtual bool takes(OpCode op, Algo algo, int64_t bytes) const {
    (void)op, (void)algo, (void)bytes;
    return true;
  }
  // True when run() enqueues on a CUDA stream and returns at once (the backend then gives the
  // op ProcessGroupNCCL's stream semantics); false when run() finishes the op before returning.
  virtual bool enqueues_on_device() const = 0;
  // Runs (or enqueues) c; returns the algorithm that ran, for the log and the stats.
  virtual Algo run(const Collective& c, const c10::Stream& stream) = 0;
};

}  // namespace pycoll

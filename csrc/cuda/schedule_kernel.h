// Schedule programs (cpu/schedule_program.h) on the CUDA engine: one generic kernel whose CTA l
// runs lane l of this rank's steps, read from a table uploaded once per (program, rank).
//
// A schedule channel (sender, receiver, lane) is the collective channel set's channel
// (sender -> receiver, block = lane) of the symmetric workspace (transport/cuda_ipc/layout.h): its
// slots, tail/head counters and check words, as every other collective kernel uses them
// (cuda/kernels/channel.cuh). A channel's messages go in order, as the program numbers them; the
// channel holds `nslots` of them, so a program whose channel_depth is larger is refused. Chunk i
// of a message sits at i chunk strides into its slot (a chunk's bytes rounded up to 16, so that
// the copies and reductions stay vectorized).
//
// Segments: as on the CPU engine, a message larger than a slot cuts the call into segments of
// every block and the program runs once per segment; the channels' counters go on from one
// segment to the next. Cross-lane deps: each lane posts how many of its steps are done (counted
// across segments) in a progress word of this engine's device memory, which the waiting lane's
// CTA polls; the last CTA of a call sets the words back to 0. With scratch and several lanes,
// the lanes meet between segments.
//
// Checks: every message carries the call's check word (op, dtype, reduce op, root, count, plan
// "schedule program": check_word.h) and, in the workspace's tag words (layout.h, SplitLayout),
// the program's digest; a receiver that reads another word reports the mismatch, which stops
// every rank (signal.cuh). Plain C++: no torch, no CUDA headers.
#pragma once

#include <cstdint>
#include <memory>

#include "common/types.h"
#include "cpu/schedule_program.h"
#include "cuda/kernels/args.h"
#include "transport/cuda_ipc/check_word.h"

namespace pycoll {

// Lanes (CTAs) of a program at most; also at most the channels of the collective set and the SMs.
constexpr int kMaxScheduleLanes = 16;
// The check word's plan codes (check_word.h): a schedule program, and how a receiver names the
// sender's call when only the program's digest differs.
constexpr int kScheduleCheckPlan = int(cuda_ipc::CheckPlan::Schedule);
constexpr int kOtherScheduleCheckPlan = int(cuda_ipc::CheckPlan::OtherSchedule);

// How a call runs: the program `segments` times, over `scratch_bytes` of scratch.
struct ScheduleGeometry {
  int64_t segments = 0;
  int64_t scratch_bytes = 0;
};

// The geometry of a call of `block` elements of `elem` bytes (0 elements: no segments) through
// slots of `slot_bytes`; std::invalid_argument, naming the program and the limit, where a chunk
// does not fit a slot.
ScheduleGeometry schedule_geometry(const ScheduleProgram& p, int64_t block, int64_t elem, int64_t slot_bytes);

// One call, as CudaEngine::run_schedule takes it. Buffers as the program expects them (aliased
// where it is in place); `out` holds the result where this rank has one.
struct ScheduleCall {
  std::shared_ptr<const ScheduleProgram> program;
  OpCode op = OpCode::AllReduce;
  int root = 0;                                    // rooted ops: the group's root (for the check word)
  int rank_shift = 0;                              // program rank v is group rank (v + rank_shift) % ranks
  int me = 0;                                      // this rank's number in the program
  int64_t block = 0;                               // elements of one block (bytes for ops that only move data)
  int64_t check_count = 0;                         // the count every rank must have passed (check_word.h)
  DType dtype = DType::UInt8;                      // the kernels' element type (UInt8: bytes)
  kernels::ReduceOp rop = kernels::ReduceOp::Sum;  // never Avg: `div` scales the result
  int div = 1;                                     // Avg: the result is divided by this
  bool holds_result = false;                       // `out` holds a reduced result (div applies)
  bool reduces = false;                            // the op reduces (its dtype and op are checked)
  char* in = nullptr;
  char* out = nullptr;
  char* scratch = nullptr;  // schedule_geometry's scratch_bytes
  // This rank refuses the call (uneven all_to_all splits) but runs the program anyway, on buffers
  // of the program's sizes, with its digest inverted: peers stop at the first message between them
  // (a digest mismatch, which aborts the group) instead of waiting until the timeout; where every
  // rank refuses alike, the kernels match and the group stays usable. The caller then throws.
  bool poisoned = false;
};

}  // namespace pycoll

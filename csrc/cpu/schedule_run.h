// Runs one rank's part of a schedule program (cpu/schedule_program.h) over the shared data regions.
//
// A channel's messages go through slots in its sender's data region: the region holds
// slot_channels x channel_depth slots; outgoing channel k's message g sits in slot
// k * depth + g % depth. A send copies its region into the slot and publishes the count of
// messages on its channel (ControlBlock::schedule_sent); a receive waits for that count, copies or
// reduces the slot into its region and publishes what it took (schedule_taken), which lets the
// sender reuse the slot channel_depth messages later. A message's chunk i sits at i chunk
// lengths into the slot, so consecutive chunks of one block move as one copy.
//
// Segments: a message larger than a slot is cut into segments of every block, and the program
// runs once per segment (chunks of a segment are its length / chunks); the channels' message
// numbers go on from one segment to the next, so segments pipeline through the slots without a
// barrier. Lanes are threads; a step waits for the steps of other lanes it depends on; with
// scratch, lanes meet between segments (a segment must not overwrite scratch another lane still
// sends). The counters only grow: an op's messages are numbered from `step`, which every rank
// advances alike.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/context.h"
#include "cpu/lane_pool.h"
#include "cpu/schedule_program.h"

namespace pycoll {

struct ScheduleRun {
  const ScheduleProgram* program = nullptr;
  int me = 0;          // this rank's number in the program
  int rank_shift = 0;  // program rank v is group rank (v + rank_shift) % ranks
  int64_t block = 0;   // elements in one block (one rank's message)
  ReduceSpec spec{};   // the reduction of receive-reduce and reduce steps (never Avg: the caller scales)
  char* in = nullptr;  // in-place programs: in and out alias as the program says
  char* out = nullptr;
  std::vector<char>* scratch = nullptr;  // grown to what the program needs
  LanePool* pool = nullptr;              // runs lanes 1..; nullptr with one lane
};

// Throws std::invalid_argument where a message's chunk does not fit a slot (PYCOLL_SHM_BYTES).
void execute_schedule(CpuContext& c, const ScheduleRun& run, uint64_t& step);

}  // namespace pycoll

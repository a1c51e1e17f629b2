// A schedule program (pycollectives.schedule) as the CPU engine runs it: every rank's steps, per
// lane, with the channel numbers and message counts the engine needs. The Python package lowers
// and checks a program and hands it over (pycollectives/schedule/engine_tables.py) through the
// source set here; the engine asks once per (name, op, ranks) and keeps the answer.
//
// Terms (as in pycollectives/schedule/ir.py): a rank's buffers are its input, output and scratch,
// cut into chunks; a lane is one thread of a rank; a channel is (sender, receiver, lane) and
// carries numbered messages, at most channel_depth of them in flight. Ranks are the program's:
// a rooted op whose root differs from the program's runs it with the ranks rotated.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/types.h"

namespace pycoll {

enum class ScheduleBuffer : int8_t { In = 0, Out = 1, Scratch = 2 };

// Chunks [first, first + count) of one buffer of the rank that runs the step.
struct ScheduleRegion {
  ScheduleBuffer buffer = ScheduleBuffer::In;
  int32_t first = 0;
  int32_t count = 0;
};

// RecvReduceSend: a receive-reduce into R and the send of R right after it, where R is not read
// again before it is overwritten (the package decides: engine_tables.py, _forwards): the message
// and R are reduced straight into the send's slot, R stays as it was. FusedAway: that send's own
// step, kept so that step numbers stay those of the program.
enum class ScheduleOp : int8_t {
  Send = 0,
  Recv = 1,
  RecvReduce = 2,
  Copy = 3,
  Reduce = 4,
  RecvReduceSend = 5,
  FusedAway = 6
};

struct ScheduleStep {
  ScheduleOp op = ScheduleOp::Copy;
  ScheduleRegion src;            // a receive's: the sender's region (its chunks' lengths bound what moves)
  ScheduleRegion dst;            // unused by a send
  int32_t peer = -1;             // send, receive: the other rank
  int32_t seq = 0;               // send, receive: the message's number on its channel in one run of the program
  int32_t channel = 0;           // send: this rank's outgoing channel number; receive: its incoming one
  int32_t peer_channel = 0;      // send: the receiver's incoming channel number; receive: the sender's outgoing one
  int32_t channel_messages = 0;  // messages on that channel in one run
  int32_t deps_begin = 0, deps_end = 0;  // RankSchedule::deps[begin, end): steps of other lanes first
  // RecvReduceSend: the send's peer, seq, channel, peer_channel and channel_messages.
  int32_t to_peer = -1, to_seq = 0, to_channel = 0, to_peer_channel = 0, to_channel_messages = 0;
};

// Step `index` of lane `lane` of the same rank.
struct ScheduleDep {
  int32_t lane = 0;
  int32_t index = 0;
};

struct RankSchedule {
  std::vector<std::vector<ScheduleStep>> lanes;
  std::vector<ScheduleDep> deps;
};

struct ScheduleProgram {
  std::string name;
  OpCode op = OpCode::AllReduce;
  int ranks = 0;
  int chunks = 1;         // chunks per block of one rank's message
  int scratch = 0;        // scratch chunks per rank
  int channel_depth = 2;  // messages in flight per channel
  int lanes = 1;
  bool inplace = false;        // the program's input and output alias (pycollectives/schedule/collectives.py, storage)
  int root = -1;               // rooted ops: the program's root
  uint64_t digest = 0;         // the first 8 bytes of the program's sha256: ranks compare it per op
  int max_message_chunks = 0;  // the largest message, in chunks
  int64_t max_channel_messages = 0;  // the most messages on one channel in one run
  int slot_channels = 0;             // the most outgoing channels of any rank
  std::vector<RankSchedule> rank;    // by the program's rank number
};

// What the package answers for (name, op, ranks): the program, or nullptr where the program of
// `name` is one of another collective (that op then runs auto). Throws std::invalid_argument with
// the package's message where the name does not resolve or the program is wrong.
using ScheduleSource = std::function<std::shared_ptr<const ScheduleProgram>(const std::string&, OpCode, int)>;
void set_schedule_source(ScheduleSource source);
// The program of (name, op, ranks), asked of the source once and kept (also its nullptr).
std::shared_ptr<const ScheduleProgram> schedule_program(const std::string& name, OpCode op, int ranks);
// Forgets every program kept (pycollectives.unregister_algorithm).
void forget_schedule_programs();

// The collective's name in pycollectives.schedule ("all_reduce", ...); nullptr for ops it has none.
const char* schedule_collective_name(OpCode op);

}  // namespace pycoll

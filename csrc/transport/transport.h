// The transport contract the CPU algorithms are written against: every rank
// exposes a control block and a data region that every peer can read, plus one
// byte channel per ordered pair (src -> dst) for point-to-point messages.
// Algorithms include this header only, never a concrete transport.
//
// Ordering: a rank writes data, then stores a counter with release; a peer
// loads the counter with acquire, then reads the data. Counters only grow
// (epochs), so nothing is ever reset.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pycoll {

constexpr int kMaxRanks = 64;
// Pipelined ops split a large message into lanes, one per thread of a rank.
constexpr int kMaxLanes = 16;
// A schedule program (cpu/schedule_program.h) may use this many channels into and out of a rank.
constexpr int kMaxScheduleChannels = 128;

// One counter per cache line: the writer and its readers never false-share.
struct alignas(64) Counter {
  std::atomic<uint64_t> value{0};
  char pad[64 - sizeof(std::atomic<uint64_t>)];
};
static_assert(sizeof(Counter) == 64, "Counter must fill one cache line");

// A buffer whose memory is a shared-memory file this rank keeps open (a tensor after
// share_memory_()): a peer maps the file through /proc/<pid>/fd/<fd> and reads the buffer in place
// (cpu/shared_storage.h). fd < 0: the buffer is private memory.
struct SharedStorageRef {
  int64_t fd = -1;
  int64_t file_bytes = 0;  // the mapping's length from the file's start
  uint64_t dev = 0;        // st_dev and st_ino: which file, whatever fd number it has in the peer
  uint64_t ino = 0;
  int64_t offset = 0;  // where the buffer starts in the file
  bool valid() const { return fd >= 0; }
};

// What each rank declares before a collective; peers compare it to catch
// mismatched calls (different op, size, dtype, root...) before any data moves.
// What every op's check reads (CpuEngine::verify) fits in the first cache line, so that a small op
// pulls one line of each peer's header; aligned so that both headers of ControlBlock start a line.
struct alignas(64) OpHeader {
  uint64_t seq;
  int32_t op;
  int32_t dtype;
  int32_t reduce;
  int32_t algo;
  int64_t root;
  int64_t count;
  uint64_t schedule_digest;     // algo schedule: the program's digest (kScheduleUnbuilt: none)
  int64_t aux;                  // op-specific (e.g. largest all_to_all block)
  int64_t lanes;                // threads this rank offers a pipelined op; the op uses the fewest any rank offers
  int64_t addr;                 // where this rank's buffer is in its own process, for peers that read it in place
  int64_t reads_shared;         // 1: this rank may read peers' shared files (PYCOLL_CPU_SHARED_TENSORS on)
  int64_t peer_read;            // this rank's PYCOLL_CPU_PEER_READ: 0 off, 1 auto, 2 on; the op uses the least
  SharedStorageRef shared_in;   // the input (broadcast: the buffer), if it lives in a shared file
  SharedStorageRef shared_out;  // all_reduce: the output, if it lives in a shared file
};
static_assert(offsetof(OpHeader, schedule_digest) + sizeof(uint64_t) <= 64,
              "what verify() reads must fit one cache line");

// An all_to_all's split tables, beside its header (ControlBlock::splits): 1 KiB that no other op
// copies or writes.
struct AllToAllSplits {
  int64_t send_bytes[kMaxRanks];  // bytes this rank sends to each peer
  int64_t recv_bytes[kMaxRanks];  // bytes this rank expects from each peer
};

// One lane of a pipelined op (cpu/pipelined.h); values are step numbers that only grow.
struct LaneCounters {
  Counter staged;    // my slot for step g holds my inputs for it
  Counter reduced;   // my slot for step g holds the chunk I reduced
  Counter consumed;  // I have read every peer's slot for step g
};

struct alignas(64) ControlBlock {
  int64_t pid;
  Counter arrive;         // barrier epochs
  Counter ring_ready;     // ring: my slot holds step g
  Counter ring_consumed;  // ring: I have read my left neighbour's step g
  Counter up_ready;       // tree reduce: my partial for segment g is published
  Counter up_consumed;    // tree reduce: I have read my children's segment g
  Counter down_ready;     // tree broadcast: my copy of segment g is published
  Counter down_consumed;  // tree broadcast: I have read my parent's segment g
  LaneCounters lanes[kMaxLanes];
  // Votes (CpuEngine::vote), seq * 8 + code.
  Counter peer_read_probe;   // 1: I can read every peer in place; 2: I cannot
  Counter shared_vote;       // 1: I mapped every peer's shared buffer (2: evicting one); 3: not allowed; 4: failed
  OpHeader header[2];        // by op sequence parity
  AllToAllSplits splits[2];  // all_to_all: by op sequence parity, as the headers
  Counter p2p_written[kMaxRanks];  // bytes I wrote into my channel to rank r
  Counter p2p_read[kMaxRanks];     // bytes I consumed from rank r's channel to me
  // How rank r's messages sent by reference ended (PointToPoint::Reply, cpu/p2p.h): set by
  // me once I copied the message or could not map it, or by r when it gave up waiting.
  Counter p2p_taken[kMaxRanks];
  // Messages that rank r offered to write into my receive buffer (PointToPoint::Answer): my answer
  // to r's offer k (and, where it is yes, my buffer's file in p2p_into[r]), and r's outcome of it
  // (PointToPoint::Fill) in p2p_filled[me] of r's block; either side may withdraw the offer there.
  Counter p2p_answer[kMaxRanks];
  SharedStorageRef p2p_into[kMaxRanks];
  Counter p2p_filled[kMaxRanks];
  // Schedule programs (cpu/schedule_run.h), by channel number, values that only grow: the
  // messages I put on my outgoing channel k (schedule_sent[k]), and those I took from my incoming
  // channel k (schedule_taken[k]), which frees the sender's slot.
  Counter schedule_sent[kMaxScheduleChannels];
  Counter schedule_taken[kMaxScheduleChannels];
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank r's collective data region (readable by all; written only by r).
  virtual char* data(int r) = 0;
  virtual size_t data_bytes() const = 0;
  virtual ControlBlock& control(int r) = 0;
  // The point-to-point ring buffer from src to dst; it lives in src's memory.
  virtual char* channel(int src, int dst) = 0;
  virtual size_t channel_bytes() const = 0;
  // False once rank r's process is known to have exited.
  virtual bool peer_alive(int r) = 0;
};

}  // namespace pycoll

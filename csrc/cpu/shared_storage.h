// Large CPU collectives over tensors that live in shared-memory files (torch's share_memory_()):
// every rank maps its peers' files once and reads their buffers in place, as the memory floor of
// pycoll-bench assumes. Nothing is staged: a reduce_scatter reads each input block once and
// writes its output once, and an all_gather or broadcast copies each byte once.
//
// Why files and not cross-memory attach (peer_read.h): process_vm_readv pins the peer's pages on
// every call, which costs more than the staging copy it saves at 1-16 MiB; a mapping is made once
// per buffer and then costs nothing: a reduce_scatter read in place from the peers' shared inputs
// runs at the memory floor, which the staged path cannot reach.
// docs/decisions/0023-cpu-shared-tensor-staging-thresholds.md
//
// A peer's file is opened through /proc/<pid>/fd/<fd> (the owner keeps it open while the tensor
// lives), checked to be the same file (st_dev, st_ino) and mapped read-only, or writable where an
// op writes into the peer's output (broadcast's root, all_reduce: below). Mappings are cached
// per peer and file, up to kMapsPerPeer files and kBytesPerPeer bytes per peer (what the current
// op uses always stays), least recently used out: a training loop reuses its buffers, so after
// the first op nothing is opened or mapped (and the engine skips the ranks' vote on whether
// everyone could map: CpuEngine::shared_buffers). A cached mapping keeps its file's memory alive
// after the owner frees the tensor (a DataLoader batch, say), until it is evicted or the group is
// destroyed: the caps bound that.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/context.h"
#include "cpu/pipelined.h"
#include "transport/transport.h"

namespace pycoll {

class PeerFileMaps {
 public:
  PeerFileMaps() = default;
  ~PeerFileMaps();
  PeerFileMaps(const PeerFileMaps&) = delete;
  PeerFileMaps& operator=(const PeerFileMaps&) = delete;

  // The first byte of rank `peer`'s buffer `ref` (its process is `pid`), mapped into this process,
  // writable only if `writable` (then opened read-write: a file the owner made read-only fails
  // with EACCES); nullptr with *err set to errno when the file cannot be opened or mapped.
  // *evicted: whether an older mapping of the peer's was dropped to make room.
  char* map(int peer, int64_t pid, const SharedStorageRef& ref, bool writable, int* err, bool* evicted);
  // The same if it is mapped already (writable, if asked), else nullptr; never opens or evicts.
  char* cached(int peer, const SharedStorageRef& ref, bool writable);
  // Starts an op: what map() returns from here on is not evicted until the next begin_op().
  void begin_op() { op_start_ = clock_ + 1; }
  // Whether map()'s error will not go away by trying again: not allowed (EACCES, EPERM, EROFS), or the
  // peer's process or file is not what this process sees under that name (another PID namespace:
  // ENOENT, ESRCH, ESTALE).
  static bool lasting(int err);

  static constexpr int kMapsPerPeer = 8;
  static constexpr int64_t kBytesPerPeer = int64_t(1) << 30;

 private:
  struct Mapping {
    int peer;
    uint64_t dev, ino;
    int64_t bytes;
    bool writable;
    void* base;
    uint64_t last_use;
  };
  // Drops the peer's least recently used mappings not used by the current op until it holds
  // fewer than kMapsPerPeer files and, with `adding` more bytes, at most kBytesPerPeer; true if
  // any went.
  bool make_room(int peer, int64_t adding);
  std::vector<Mapping> maps_;
  uint64_t clock_ = 0;
  uint64_t op_start_ = 1;
};

// ins[r]: rank r's input, readable in this process; outs[r]: its output, writable here (my own
// are my pointers). A peer that gave up on the op (its timeout) may return while a slower rank
// still writes its slice into that peer's output; the group is broken by then, as it is when a
// staged op times out.

// all_gather of m elements of t per rank into out (n * m); ins[me] may be my block of out.
void shared_all_gather(Pipeline& p, DType t, const std::vector<const char*>& ins, char* out, int64_t m);
// broadcast: with root_writes, the message in n parts; the root writes part q into rank q's buffer
// (bufs[q], writable; the root needs every rank's, the others only their own) while every other
// rank copies the other parts from root_buf: each rank moves (n-1)/n of the message. A pull by
// the readers alone leaves the root idle while each reader moves all of it; that is what runs
// without root_writes (some rank's buffer is private, or the op has more lanes than the plan lets
// the root write with). docs/decisions/0023-cpu-shared-tensor-staging-thresholds.md
void shared_broadcast(Pipeline& p, DType t, const char* root_buf, const std::vector<char*>& bufs, bool root_writes,
                      int64_t count, int root);
// reduce_scatter: out (m) = every rank's block `me` of its input, reduced in rank order.
void shared_reduce_scatter(Pipeline& p, const ReduceSpec& spec, const std::vector<const char*>& ins, char* out,
                           int64_t m);
// all_reduce: rank r reduces slice r from every input (rank order, so every rank gets the same
// bits) a chunk at a time into its output, and writes each chunk on into every peer's output
// (outs[q], writable) while it is still in cache. Only rank r touches slice r of any buffer, so a
// rank's input may be its output and no barrier is needed between reducing and writing; the
// caller's closing barrier keeps every rank until every slice of its output has arrived.
void shared_all_reduce(Pipeline& p, const ReduceSpec& spec, const std::vector<const char*>& ins,
                       const std::vector<char*>& outs, int64_t count);

}  // namespace pycoll

// Point-to-point messages over the per-pair byte channels of the transport.
//
// Terms: a channel (src -> dst) is a ring buffer in src's memory with two
// counters: p2p_written[dst] in src's control block and p2p_read[src] in
// dst's. A message is a header (tag, bytes, by_reference) followed by the
// payload, streamed through the channel in as many pieces as it takes.
//
// One sender thread per destination and one receiver thread per source, so
// a send never blocks the caller, never waits behind a send to another peer,
// and both ranks may send before they receive. A receive whose tag does not
// match the next message buffers that message (heap copy) until a receive
// with its tag is posted: tags may be received in any order.
//
// A receive from any source is posted to every source's lane; each lane polls its channel
// without blocking until one of them finds a message with the tag and claims the receive (the
// others buffer what they read meanwhile, as for any unexpected message). Matching stays in
// posting order per source: requests posted on a lane after it wait behind it.
//
// By reference: a message larger than the channel whose bytes live in a shared-memory file (a
// tensor after share_memory_(), or made by the shared CPU allocator) travels as its header and the
// file's name (SharedStorageRef) instead. The receiver maps the file (PeerFileMaps, cached per
// source) and copies the message straight into its buffer: one copy where the channel makes two.
// It then settles the message in its p2p_taken[src] word (Reply), and only then does the send
// complete, so the sender's buffer stays untouched while it is read. A receiver that cannot map
// the file (not allowed, PYCOLL_CPU_SHARED_TENSORS=off there, another PID namespace) asks for the
// bytes, which follow through the channel as usual; where that will not change, the sender
// streams every later message to that peer. A sender that gives up waiting (timeout, abort, the
// group destroyed) withdraws the message in the same word; the two race with a compare-and-swap,
// so a receiver still copying when its sender failed fails too, instead of delivering bytes the
// sender's caller may be overwriting. Only messages that cannot fit in the channel go by
// reference: their send waits for the receiver either way, so no program that progressed before
// can block now. And only where the ranks have no CPU to spare (may_send_by_reference).
//
// Into the receiver's shared tensor: the same message from a private buffer, where the receive's
// buffer lives in a shared file, is written by the sender straight into it: one copy again. The
// sender's header offers it and carries no bytes; the receiver, once a receive takes the message,
// answers in its p2p_answer[src] word (with its buffer's file in p2p_into[src]) or asks for the
// bytes (a buffer not in a shared file, an unexpected message, a receive from any source). The
// sender maps the file writable, claims the message in its p2p_filled[dst] word (Fill), copies,
// and marks it written; or marks that the bytes follow through the channel. Either side may
// withdraw the message in that word before the sender claims it (compare-and-swap, as for
// Reply); once claimed, the receiver waits for the copy while the sender lives.
//
// A lane thread may destroy this object itself (its finished request held the
// last reference to the group): lanes are shared with their threads, and the
// destructor detaches the calling thread instead of joining it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu/lane_pool.h"
#include "cpu/shared_storage.h"
#include "transport/transport.h"

namespace pycoll {

class PointToPoint {
 public:
  using Done = std::function<void(std::exception_ptr)>;
  // `shared_tensors`: this rank's PYCOLL_CPU_SHARED_TENSORS; on, it sends by reference and maps
  // what its peers send so.
  PointToPoint(Transport& t, std::chrono::milliseconds timeout, const std::atomic<bool>* abort, bool shared_tensors);
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  // `data` must stay valid until `done` runs (on a p2p thread). `shared`: the shared file that
  // holds `data` (engines/shared_storage_ref.h), where may_send_by_reference(bytes) said yes: the
  // message then goes by reference.
  void post_send(int dst, int64_t tag, const char* data, int64_t bytes, Done done, SharedStorageRef shared = {});
  // `into`: the shared file that holds `data`, where may_receive_into_shared(bytes) said yes: a
  // sender of a private buffer may then write the message straight into it.
  void post_recv(int src, int64_t tag, char* data, int64_t bytes, Done done, SharedStorageRef into = {});
  // Whether a message of `bytes` goes by reference when its bytes live in a shared file: the
  // caller looks the file up only then, and passes it to post_send. Only where the calling
  // thread's ranks have no CPU to spare (cpu_to_spare_per_rank, cpu/lane_pool.h): with
  // spare CPUs the channel's two copies run on two cores at once, in cache, and beat one core
  // copying alone (decision 0020).
  bool may_send_by_reference(int64_t bytes) const {
    return shared_tensors_ && static_cast<uint64_t>(bytes) > t_.channel_bytes() && !cpu_to_spare_per_rank(t_.size());
  }
  // Whether a receive of `bytes` may take the message into its own shared file: by the same rule.
  bool may_receive_into_shared(int64_t bytes) const { return may_send_by_reference(bytes); }
  // A receive from whichever peer first sends a message with `tag`; `done` gets that peer.
  using DoneFrom = std::function<void(int src, std::exception_ptr)>;
  void post_recv_any(int64_t tag, char* data, int64_t bytes, DoneFrom done);

 private:
  struct AnySource;  // a receive from any source, shared by every source's lane
  struct Request {
    int64_t tag;
    char* data;
    int64_t bytes;
    Done done;
    std::shared_ptr<AnySource> any;  // set for a receive from any source (then `done` is unused)
    SharedStorageRef shared;         // where `data` lives, if in a shared file (and may be used)
  };
  struct Lane {  // one peer, one direction
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Request> queue;
    std::thread thread;
    bool stop = false;
    std::exception_ptr broken;                               // first stream error
    std::map<int64_t, std::deque<std::vector<char>>> early;  // receive lanes: messages nobody asked for yet
    uint64_t by_reference = 0;    // messages by reference sent (send lane) or read (receive lane)
    bool streams_only = false;    // send lane: the peer cannot map this rank's files, send bytes from now on
    uint64_t offers = 0;          // messages offered to write into the receiver's file, sent or read
    bool offers_refused = false;  // send lane: the peer never takes them, or its files cannot be mapped here
    PeerFileMaps maps;            // the peer's files mapped here (receive lane: read; send lane: written)
  };
  using Lanes = std::vector<std::shared_ptr<Lane>>;
  void post(Lanes& lanes, int peer, Request req, bool send);
  // Waits for the next request; false once the lane is stopped and drained.
  static bool next(Lane& lane, Request& req);
  void send_loop(int dst, Lane& lane);
  void recv_loop(int src, Lane& lane);
  // This lane's part of a receive from any source: returns once the receive is claimed.
  void serve_any(int src, Lane& lane, const std::shared_ptr<AnySource>& any);
  // Sends one message whole: by reference where it may (file comment), else through the channel.
  void send_message(int dst, Lane& lane, const Request& req);
  struct MessageHeader {
    int64_t tag;
    int64_t bytes;
    int64_t by_reference;  // 1: a SharedStorageRef follows instead of the bytes; 2: an offer (file comment)
  };
  static constexpr int64_t kOffer = 2;
  // The receiver's answer to offer k: its word holds kReplyStride * k + one of these.
  enum Answer : uint64_t {
    kWriteInto = 1,        // write it into my buffer, whose file is in p2p_into
    kSendBytes = 2,        // send the bytes through the channel this time
    kSendBytesAlways = 3,  // and every later message (PYCOLL_CPU_SHARED_TENSORS off here)
  };
  // How offer k ended, in the sender's p2p_filled[dst]: kReplyStride * k + one of these.
  enum Fill : uint64_t {
    kWriting = 1,      // the sender claimed it and is writing (never withdrawn from here)
    kWritten = 2,      // the bytes are in the receiver's buffer
    kBytesFollow = 3,  // the bytes follow through the channel
    kGivenUp = 4,      // withdrawn by either side: the send and the receive fail
  };
  // The sender's side of an offer; false when the bytes must follow through the channel.
  bool write_into_receiver(int dst, Lane& lane, const Request& req);
  // The receiver's side: answers offer k with `into` (or asks for the bytes) and takes the message.
  void receive_offer(int src, Lane& lane, const MessageHeader& h, char* p, const SharedStorageRef& into, bool stream);
  // How message k by reference ended: its reply word holds kReplyStride * k + one of these.
  enum Reply : uint64_t {
    kCopied = 1,        // the receiver copied it: the send is done
    kStreamThis = 2,    // the receiver could not map the file this time: send the bytes
    kStreamAlways = 3,  // nor will it ever: send the bytes, and stream every later message
    kWithdrawn = 4,     // the sender gave up: the receive fails
  };
  static constexpr uint64_t kReplyStride = 8;
  // Sets message k's reply to `outcome` unless it is set already; *winner: the reply that stands.
  static bool settle(std::atomic<uint64_t>& word, uint64_t k, uint64_t outcome, uint64_t* winner);
  // Reads the next message's header, then (receive_body) its bytes into p, which holds h.bytes.
  MessageHeader read_header(int src);
  // into_user_buffer: p is the receive's own tensor (streamed where large), not a buffer of ours.
  // into: the receive's shared file, where the sender may write the message straight into p.
  void receive_body(int src, Lane& lane, const MessageHeader& h, char* p, bool into_user_buffer,
                    const SharedStorageRef& into = {});
  // Copies a message sent by reference into p from the peer's mapped file: kCopied, or the Reply
  // that asks for the bytes (nothing copied) where the file cannot be mapped here.
  uint64_t copy_by_reference(int src, Lane& lane, const SharedStorageRef& ref, char* p, int64_t bytes, bool stream);
  // The `bytes` of rank `peer`'s buffer `ref`, mapped through the lane's cache (writable, if asked);
  // nullptr with *why, and *lasting where the failure will not pass, where it lies outside its file
  // or cannot be mapped. Both directions of a message in a shared file use it.
  char* map_message(int peer, Lane& lane, const SharedStorageRef& ref, int64_t bytes, bool writable, const char** why,
                    bool* lasting);
  void write_stream(int dst, const char* p, int64_t n);
  void read_stream(int src, char* p, int64_t n, bool stream);
  // Whether a received message of `bytes` is written into the user's buffer with streaming stores
  // (cpu/kernels/stream_store.h).
  bool streams_into(int64_t bytes) const;

  Transport& t_;
  std::chrono::milliseconds timeout_;
  const std::atomic<bool>* abort_;
  const bool shared_tensors_;
  const size_t stream_min_bytes_;  // stream_store_min_bytes, read once
  std::mutex lanes_mu_;
  Lanes send_lanes_;
  Lanes recv_lanes_;
};

}  // namespace pycoll

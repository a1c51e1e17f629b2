#include "cpu/p2p.h"

#include <cstdio>
#include <cstring>
#include <thread>

#include "cpu/sync.h"
#include "common/check.h"
#include "common/env.h"
#include "common/owned_thread.h"
#include "common/test_hooks.h"
#include "cpu/kernels/stream_store.h"

namespace pycoll {

namespace {
// The most either side copies through the channel before it publishes: a message larger than this
// streams in pieces, so that the receiver copies piece i out while the sender copies piece i+1 in,
// each piece still in cache. Whole-ring pieces (4 MiB) made the two take turns instead, each copy
// going to memory; 64 KiB and 1 MiB pieces were no better. docs/decisions/0020-p2p-by-reference.md
constexpr uint64_t kStreamPieceBytes = 256 << 10;
}  // namespace

struct PointToPoint::AnySource {
  int64_t tag;
  char* data;
  int64_t bytes;
  DoneFrom done;
  std::chrono::steady_clock::time_point deadline;
  std::atomic<bool> claimed{false};
  // The lane that claims it calls done exactly once.
  bool claim() { return !claimed.exchange(true); }
};

PointToPoint::PointToPoint(Transport& t, std::chrono::milliseconds timeout, const std::atomic<bool>* abort,
                           bool shared_tensors)
    : t_(t),
      timeout_(timeout),
      abort_(abort),
      shared_tensors_(shared_tensors),
      stream_min_bytes_(stream_store_min_bytes(t.size())) {
  send_lanes_.resize(t.size());
  recv_lanes_.resize(t.size());
}

PointToPoint::~PointToPoint() {
  std::deque<Request> orphans;  // queued on the lane whose thread runs this destructor
  for (auto* lanes : {&send_lanes_, &recv_lanes_}) {
    for (auto& lane : *lanes) {
      if (!lane) continue;
      {
        std::lock_guard<std::mutex> g(lane->mu);
        lane->stop = true;
        // This thread stops serving its lane here (the transport is about to go): what it has not
        // started fails below instead of running on a destroyed object.
        if (is_current_thread(lane->thread)) orphans.swap(lane->queue);
      }
      lane->cv.notify_all();
    }
  }
  for (auto* lanes : {&send_lanes_, &recv_lanes_}) {
    for (auto& lane : *lanes) {
      if (lane) join_unless_current(lane->thread);
    }
  }
  for (auto& req : orphans) {
    req.done(std::make_exception_ptr(
        std::runtime_error("pycoll: point-to-point request dropped: the process group was destroyed before it ran")));
  }
}

void PointToPoint::post(Lanes& lanes, int peer, Request req, bool send) {
  Lane* lane;
  {
    std::lock_guard<std::mutex> g(lanes_mu_);
    if (!lanes[peer]) {
      auto l = std::make_shared<Lane>();
      // The thread co-owns its lane: it may outlive this object (see the file comment).
      l->thread = send ? std::thread([this, peer, l] { send_loop(peer, *l); })
                       : std::thread([this, peer, l] { recv_loop(peer, *l); });
      lanes[peer] = std::move(l);
    }
    lane = lanes[peer].get();
  }
  {
    std::lock_guard<std::mutex> g(lane->mu);
    lane->queue.push_back(std::move(req));
  }
  lane->cv.notify_one();
}

void PointToPoint::post_send(int dst, int64_t tag, const char* data, int64_t bytes, Done done,
                             SharedStorageRef shared) {
  post(send_lanes_, dst, Request{tag, const_cast<char*>(data), bytes, std::move(done), nullptr, shared}, true);
}

void PointToPoint::post_recv(int src, int64_t tag, char* data, int64_t bytes, Done done, SharedStorageRef into) {
  post(recv_lanes_, src, Request{tag, data, bytes, std::move(done), nullptr, into}, false);
}

void PointToPoint::post_recv_any(int64_t tag, char* data, int64_t bytes, DoneFrom done) {
  auto any = std::make_shared<AnySource>();
  any->tag = tag;
  any->data = data;
  any->bytes = bytes;
  any->done = std::move(done);
  any->deadline = std::chrono::steady_clock::now() + timeout_;
  const int me = t_.rank();
  if (t_.size() == 1) {
    any->done(-1, std::make_exception_ptr(std::runtime_error(
                      "pycoll::recv: receiving from any source in a group of one rank: no peer can send")));
    return;
  }
  for (int src = 0; src < t_.size(); ++src) {
    if (src != me) post(recv_lanes_, src, Request{tag, data, bytes, nullptr, any}, false);
  }
}

void PointToPoint::serve_any(int src, Lane& lane, const std::shared_ptr<AnySource>& any) {
  auto size_error = [&](int64_t sent) {
    return std::make_exception_ptr(
        std::runtime_error(str("pycoll::recv: rank ", src, " sent ", sent, " bytes with tag ", any->tag,
                               " but this receive expects ", any->bytes, " bytes")));
  };
  // A message that arrived before this receive was posted.
  auto it = lane.early.find(any->tag);
  if (it != lane.early.end() && !it->second.empty()) {
    if (!any->claim()) return;
    std::vector<char> msg = std::move(it->second.front());
    it->second.pop_front();
    std::exception_ptr err;
    if (static_cast<int64_t>(msg.size()) != any->bytes) {
      err = size_error(static_cast<int64_t>(msg.size()));
    } else if (any->bytes > 0) {
      std::memcpy(any->data, msg.data(), msg.size());
    }
    any->done(src, err);
    return;
  }
  const int me = t_.rank();
  auto& written = t_.control(src).p2p_written[me].value;
  auto& read = t_.control(me).p2p_read[src].value;
  while (!any->claimed.load()) {
    if (written.load(std::memory_order_acquire) == read.load(std::memory_order_relaxed)) {
      bool stopping;
      {
        std::lock_guard<std::mutex> g(lane.mu);
        stopping = lane.stop;
      }
      const bool aborted = stopping || (abort_ && abort_->load());
      if (aborted || std::chrono::steady_clock::now() > any->deadline) {
        if (any->claim()) {
          any->done(-1, std::make_exception_ptr(GroupBroken(
                            aborted ? "pycoll::recv from any source: the group was aborted or destroyed"
                                    : str("pycoll::recv from any source: timed out after ", timeout_.count(),
                                          " ms with no message with tag ", any->tag, " from any peer"))));
        }
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      continue;
    }
    // A message has started: read it whole (the sender is writing it).
    const MessageHeader h = read_header(src);
    if (h.tag == any->tag && any->claim()) {
      std::exception_ptr err;
      if (h.bytes != any->bytes) {
        std::vector<char> sink(static_cast<size_t>(h.bytes));  // keep the stream in step
        receive_body(src, lane, h, sink.data(), false);
        err = size_error(h.bytes);
      } else {
        receive_body(src, lane, h, any->data, true);
      }
      any->done(src, err);
      return;
    }
    std::vector<char> msg(static_cast<size_t>(h.bytes));
    receive_body(src, lane, h, msg.data(), false);
    lane.early[h.tag].push_back(std::move(msg));
  }
}

void PointToPoint::send_message(int dst, Lane& lane, const Request& req) {
  const int me = t_.rank();
  // The caller passed the file only where may_send_by_reference said yes; the size is checked
  // again because a smaller message must complete without its receiver.
  const bool by_reference =
      !lane.streams_only && req.shared.valid() && static_cast<uint64_t>(req.bytes) > t_.channel_bytes();
  // A private buffer (or one the receiver cannot map) as large: offer to write it into the
  // receive's buffer, should that live in a shared file.
  const bool offer = !by_reference && !lane.offers_refused && may_send_by_reference(req.bytes);
  const MessageHeader h{req.tag, req.bytes, by_reference ? 1 : (offer ? kOffer : 0)};
  write_stream(dst, reinterpret_cast<const char*>(&h), sizeof(h));
  if (offer) {
    if (!write_into_receiver(dst, lane, req)) write_stream(dst, req.data, req.bytes);
    return;
  }
  if (by_reference) {
    write_stream(dst, reinterpret_cast<const char*>(&req.shared), sizeof(req.shared));
    const uint64_t k = lane.by_reference++;
    auto& reply = t_.control(dst).p2p_taken[me].value;
    uint64_t outcome = 0;
    try {
      // Asleep in the kernel: the copy takes hundreds of microseconds or more (the message is
      // larger than the channel), and a sender that spun or woke meanwhile would take CPU time
      // from the receiver's copy wherever the ranks share cores. One wake-up per message is cheap.
      Waiter w(t_, timeout_, abort_, str("pycoll::send to rank ", dst));
      w.until_ge_asleep(dst, reply, kReplyStride * k + 1,
                        "receiver copying the message out of this rank's shared memory");
      outcome = reply.load(std::memory_order_acquire) - kReplyStride * k;
    } catch (...) {
      // Withdraw the message unless the receiver has settled it: the caller may overwrite the
      // buffer once this send has failed.
      if (settle(reply, k, kWithdrawn, &outcome) || outcome != kCopied) throw;
    }
    if (outcome == kCopied) return;
    if (outcome == kStreamAlways) {
      lane.streams_only = true;
      if (debug_info_enabled()) {
        std::fprintf(stderr,
                     "[pycoll %d/%d] rank %d cannot map this rank's shared-memory tensors: sends to it go through "
                     "the channel\n",
                     me, t_.size(), dst);
      }
    }
  }
  write_stream(dst, req.data, req.bytes);
}

bool PointToPoint::write_into_receiver(int dst, Lane& lane, const Request& req) {
  const int me = t_.rank();
  const uint64_t k = lane.offers++;
  const uint64_t base = kReplyStride * k;
  auto& answer = t_.control(dst).p2p_answer[me].value;
  auto& filled = t_.control(me).p2p_filled[dst].value;
  uint64_t outcome = 0;
  try {
    // Asleep: the receiver may post its receive much later.
    Waiter w(t_, timeout_, abort_, str("pycoll::send to rank ", dst));
    w.until_ge_asleep(dst, answer, base + 1, "receiver taking the message");
  } catch (...) {
    settle(filled, k, kGivenUp, &outcome);  // or the receiver gave up first: failed either way
    wake_sleepers(filled);
    throw;
  }
  auto receiver_gave_up = [&] {
    return GroupBroken(str("pycoll::send to rank ", dst, ": the receiver gave up on the message (its receive ",
                           "failed: timed out, aborted or destroyed)"));
  };
  const uint64_t a = answer.load(std::memory_order_acquire) - base;
  if (a == kWriteInto) {
    const SharedStorageRef into = t_.control(dst).p2p_into[me];  // published before the answer
    const char* why = nullptr;
    bool lasting = false;
    char* target = map_message(dst, lane, into, req.bytes, /*writable=*/true, &why, &lasting);
    if (lasting) lane.offers_refused = true;
    if (target != nullptr) {
      if (!settle(filled, k, kWriting, &outcome)) throw receiver_gave_up();
      wake_sleepers(filled);
      copy_to_output(streams_into(req.bytes), target, req.data, static_cast<size_t>(req.bytes));
      filled.store(base + kWritten, std::memory_order_release);
      wake_sleepers(filled);
      test_hooks::count_p2p_into_receiver();
      return true;
    }
    if (debug_info_enabled()) {
      std::fprintf(
          stderr, "[pycoll %d/%d] rank %d's shared-memory receive buffer cannot be mapped here (%s): %s\n", me,
          t_.size(), dst, why,
          lane.offers_refused ? "messages to it go through the channel" : "this message goes through the channel");
    }
  } else if (a == kSendBytesAlways) {
    lane.offers_refused = true;
  }
  if (!settle(filled, k, kBytesFollow, &outcome)) throw receiver_gave_up();
  wake_sleepers(filled);
  return false;
}

void PointToPoint::receive_offer(int src, Lane& lane, const MessageHeader& h, char* p, const SharedStorageRef& into,
                                 bool stream) {
  const int me = t_.rank();
  const uint64_t k = lane.offers++;
  const uint64_t base = kReplyStride * k;
  auto& answer = t_.control(me).p2p_answer[src].value;
  auto& filled = t_.control(src).p2p_filled[me].value;
  const bool take = shared_tensors_ && into.valid();
  if (take) t_.control(me).p2p_into[src] = into;
  answer.store(base + (take ? kWriteInto : shared_tensors_ ? kSendBytes : kSendBytesAlways), std::memory_order_release);
  wake_sleepers(answer);
  uint64_t outcome = 0;
  try {
    Waiter w(t_, timeout_, abort_, str("pycoll::recv from rank ", src));
    w.until_ge_asleep(src, filled, base + 1, "sender writing the message into this rank's buffer");
    outcome = filled.load(std::memory_order_acquire) - base;
  } catch (...) {
    if (settle(filled, k, kGivenUp, &outcome)) throw;  // withdrawn before the sender claimed it
  }
  // Claimed: the sender is writing into the buffer, so the receive ends only once it has finished
  // (or exited), whatever this side's deadline; the copy takes milliseconds.
  while (outcome == kWriting) {
    try {
      Waiter w(t_, timeout_, abort_, str("pycoll::recv from rank ", src));
      w.until_ge_asleep(src, filled, base + kWritten, "sender writing the message into this rank's buffer");
    } catch (...) {
      if (!t_.peer_alive(src)) throw;
    }
    outcome = filled.load(std::memory_order_acquire) - base;
  }
  if (outcome == kWritten) return;
  if (outcome == kBytesFollow) {
    read_stream(src, p, h.bytes, stream);
    return;
  }
  throw GroupBroken(str("pycoll::recv from rank ", src,
                        ": the sender gave up on the message (its send failed: ", "timed out, aborted or destroyed)"));
}

bool PointToPoint::settle(std::atomic<uint64_t>& word, uint64_t k, uint64_t outcome, uint64_t* winner) {
  const uint64_t base = kReplyStride * k;  // earlier messages' replies are all below base
  uint64_t seen = word.load(std::memory_order_acquire);
  for (;;) {
    if (seen > base) {
      *winner = seen - base;
      return false;
    }
    // Release: a receiver's copy happens before the sender sees kCopied.
    if (word.compare_exchange_weak(seen, base + outcome, std::memory_order_acq_rel, std::memory_order_acquire)) {
      *winner = outcome;
      return true;
    }
  }
}

PointToPoint::MessageHeader PointToPoint::read_header(int src) {
  MessageHeader h{};
  read_stream(src, reinterpret_cast<char*>(&h), sizeof(h), false);
  return h;
}

void PointToPoint::receive_body(int src, Lane& lane, const MessageHeader& h, char* p, bool into_user_buffer,
                                const SharedStorageRef& into) {
  // Only the user's buffer is streamed: a buffer of ours is read again soon, from the cache.
  const bool stream = into_user_buffer && streams_into(h.bytes);
  if (h.by_reference == kOffer) {
    receive_offer(src, lane, h, p, into_user_buffer ? into : SharedStorageRef{}, stream);
    return;
  }
  if (!h.by_reference) {
    read_stream(src, p, h.bytes, stream);
    return;
  }
  SharedStorageRef ref;
  read_stream(src, reinterpret_cast<char*>(&ref), sizeof(ref), false);
  const uint64_t k = lane.by_reference++;
  auto& reply = t_.control(t_.rank()).p2p_taken[src].value;
  const uint64_t mine = copy_by_reference(src, lane, ref, p, h.bytes, stream);
  uint64_t winner = 0;
  if (!settle(reply, k, mine, &winner)) {
    throw GroupBroken(str("pycoll::recv from rank ", src, ": the sender gave up on the message (its send failed: ",
                          "timed out, aborted or destroyed) while this rank read it"));
  }
  wake_sleepers(reply);
  if (mine != kCopied) read_stream(src, p, h.bytes, stream);
}

uint64_t PointToPoint::copy_by_reference(int src, Lane& lane, const SharedStorageRef& ref, char* p, int64_t bytes,
                                         bool stream) {
  if (!shared_tensors_) return kStreamAlways;
  const char* why = nullptr;
  bool lasting = false;
  const char* peer = map_message(src, lane, ref, bytes, /*writable=*/false, &why, &lasting);
  const uint64_t refusal = lasting ? kStreamAlways : kStreamThis;
  if (peer == nullptr) {
    if (debug_info_enabled()) {
      std::fprintf(stderr, "[pycoll %d/%d] rank %d's shared-memory tensor cannot be mapped (%s): %s\n", t_.rank(),
                   t_.size(), src, why,
                   refusal == kStreamAlways ? "point-to-point messages from it go through the channel"
                                            : "this message goes through the channel");
    }
    return refusal;
  }
  copy_to_output(stream, p, peer, static_cast<size_t>(bytes));
  test_hooks::count_p2p_by_reference();
  return kCopied;
}

char* PointToPoint::map_message(int peer, Lane& lane, const SharedStorageRef& ref, int64_t bytes, bool writable,
                                const char** why, bool* lasting) {
  *lasting = false;
  if (ref.offset < 0 || bytes < 0 || ref.offset + bytes > ref.file_bytes) {
    *why = "the message does not lie inside the file it names";
    return nullptr;
  }
  lane.maps.begin_op();
  int err = 0;
  bool evicted = false;
  char* p = lane.maps.map(peer, t_.control(peer).pid, ref, writable, &err, &evicted);
  if (p == nullptr) {
    *why = std::strerror(err);
    *lasting = PeerFileMaps::lasting(err);
  }
  return p;
}

void PointToPoint::write_stream(int dst, const char* p, int64_t n) {
  const int me = t_.rank();
  const uint64_t cap = t_.channel_bytes();
  auto& written = t_.control(me).p2p_written[dst].value;
  auto& read = t_.control(dst).p2p_read[me].value;
  char* ring = t_.channel(me, dst);
  Waiter w(t_, timeout_, abort_, str("pycoll::send to rank ", dst));
  uint64_t pos = written.load(std::memory_order_relaxed);
  while (n > 0) {
    uint64_t space = cap - (pos - read.load(std::memory_order_acquire));
    if (space == 0) {
      w.until_ge(dst, read, pos - cap + 1, "receiver draining the channel");
      continue;
    }
    const uint64_t off = pos % cap;
    const uint64_t k = std::min<uint64_t>({static_cast<uint64_t>(n), space, cap - off, kStreamPieceBytes});
    std::memcpy(ring + off, p, k);
    pos += k;
    p += k;
    n -= static_cast<int64_t>(k);
    written.store(pos, std::memory_order_release);
  }
}

bool PointToPoint::streams_into(int64_t bytes) const {
  return bytes > 0 && static_cast<size_t>(bytes) >= stream_min_bytes_;
}

void PointToPoint::read_stream(int src, char* p, int64_t n, bool stream) {
  const int me = t_.rank();
  const uint64_t cap = t_.channel_bytes();
  auto& written = t_.control(src).p2p_written[me].value;
  auto& read = t_.control(me).p2p_read[src].value;
  const char* ring = t_.channel(src, me);
  Waiter w(t_, timeout_, abort_, str("pycoll::recv from rank ", src));
  uint64_t pos = read.load(std::memory_order_relaxed);
  while (n > 0) {
    uint64_t avail = written.load(std::memory_order_acquire) - pos;
    if (avail == 0) {
      w.until_ge(src, written, pos + 1, "sender writing the channel");
      continue;
    }
    const uint64_t off = pos % cap;
    const uint64_t k = std::min<uint64_t>({static_cast<uint64_t>(n), avail, cap - off, kStreamPieceBytes});
    copy_to_output(stream, p, ring + off, k);
    pos += k;
    p += k;
    n -= static_cast<int64_t>(k);
    read.store(pos, std::memory_order_release);
  }
}

bool PointToPoint::next(Lane& lane, Request& req) {
  std::unique_lock<std::mutex> lk(lane.mu);
  lane.cv.wait(lk, [&] { return lane.stop || !lane.queue.empty(); });
  if (lane.queue.empty()) return false;
  req = std::move(lane.queue.front());
  lane.queue.pop_front();
  return true;
}

void PointToPoint::send_loop(int dst, Lane& lane) {
  Request req;
  while (next(lane, req)) {
    std::exception_ptr err = lane.broken;
    if (!err) {
      try {
        send_message(dst, lane, req);
      } catch (...) {
        err = std::current_exception();
        lane.broken = err;  // the stream is out of step: later sends fail fast
      }
    }
    req.done(err);
    test_hooks::linger_if_set();
    // May drop the last reference to the group and destroy this object: from here on the loop
    // touches only `lane`, which it co-owns.
    req = Request{};
  }
}

void PointToPoint::recv_loop(int src, Lane& lane) {
  Request req;
  while (next(lane, req)) {
    if (req.any) {
      try {
        if (lane.broken) std::rethrow_exception(lane.broken);
        serve_any(src, lane, req.any);
      } catch (...) {
        lane.broken = std::current_exception();
        if (req.any->claim()) req.any->done(src, lane.broken);
      }
      req = Request{};
      continue;
    }
    std::exception_ptr err = lane.broken;
    auto size_error = [&](int64_t sent) {
      return std::make_exception_ptr(
          std::runtime_error(str("pycoll::recv: rank ", src, " sent ", sent, " bytes with tag ", req.tag,
                                 " but this receive expects ", req.bytes, " bytes")));
    };
    if (!err) {
      try {
        auto it = lane.early.find(req.tag);
        if (it != lane.early.end() && !it->second.empty()) {
          std::vector<char> msg = std::move(it->second.front());
          it->second.pop_front();
          if (static_cast<int64_t>(msg.size()) != req.bytes) {
            err = size_error(static_cast<int64_t>(msg.size()));
          } else if (req.bytes > 0) {
            std::memcpy(req.data, msg.data(), msg.size());
          }
        } else {
          for (;;) {
            const MessageHeader h = read_header(src);
            if (h.tag == req.tag) {
              if (h.bytes != req.bytes) {
                std::vector<char> sink(static_cast<size_t>(h.bytes));  // keep the stream in step
                receive_body(src, lane, h, sink.data(), false);
                err = size_error(h.bytes);
              } else {
                receive_body(src, lane, h, req.data, true, req.shared);
              }
              break;
            }
            std::vector<char> msg(static_cast<size_t>(h.bytes));
            receive_body(src, lane, h, msg.data(), false);
            lane.early[h.tag].push_back(std::move(msg));
          }
        }
      } catch (...) {
        err = std::current_exception();
        lane.broken = err;
      }
    }
    req.done(err);
    test_hooks::linger_if_set();
    // May drop the last reference to the group and destroy this object: from here on the loop
    // touches only `lane`, which it co-owns.
    req = Request{};
  }
}

}  // namespace pycoll

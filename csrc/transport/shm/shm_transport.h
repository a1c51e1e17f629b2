// Shared-memory transport for CPU ranks on one host. Each rank creates one
// segment: [ControlBlock | data region | one p2p channel per peer]. Segment
// names carry a random token that rank 0 puts in the Store, so two jobs never
// collide and no other job can guess them.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/rendezvous.h"
#include "transport/shm/shm_segment.h"
#include "transport/transport.h"

namespace pycoll {

class ShmTransport final : public Transport {
 public:
  // Collective over the group: creates, exchanges, maps, then unlinks.
  ShmTransport(const Rendezvous& rv, int rank, int size, size_t data_bytes, size_t channel_bytes,
               std::chrono::milliseconds timeout);
  ~ShmTransport() override = default;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  char* data(int r) override;
  size_t data_bytes() const override { return data_bytes_; }
  ControlBlock& control(int r) override;
  char* channel(int src, int dst) override;
  size_t channel_bytes() const override { return channel_bytes_; }
  bool peer_alive(int r) override;

 private:
  size_t segment_bytes() const;
  int rank_;
  int size_;
  size_t data_bytes_;
  size_t channel_bytes_;
  std::vector<ShmSegment> segments_;  // index = rank
  std::vector<int64_t> pids_;
};

}  // namespace pycoll

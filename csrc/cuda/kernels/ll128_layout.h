// The LL128 two-shot's workspace region (cuda/kernels/ll128_two_shot.cuh), laid out from the start that
// the workspace gives it (cuda_ipc::ProtocolRegion, registered in cuda/ll128_two_shot.cpp). It
// holds a whole two-shot all_reduce of up to the protocol's limit: 128-byte lines of 120 payload
// bytes and a 64-bit flag, one line per 120 bytes of a segment, for the scatter and for the gather
// phase of every sender. No line is reused within a call, so no credit flows back; why one buffer
// (no parity) suffices is in the kernel's comment. Plain C++: the kernel and the registration share it.
#pragma once

#include <cstdint>

#include "transport/cuda_ipc/layout.h"

namespace pycoll {
namespace cuda_ipc {

// The name the protocol is registered under, by its registration and by its launcher
// (cuda/ll128_two_shot.cpp, cuda/launch_ll128.cu).
constexpr const char* kLL128ProtocolName = "ll128";

// docs/decisions/0010-ll128-two-shot.md
constexpr int kLL128Blocks = 128;  // CTAs of an LL128 kernel at most
constexpr int64_t kLL128LineBytes = 128;
constexpr int64_t kLL128LinePayload = 120;  // the last 8 bytes of a line are its flag

// Lines one segment of a `bytes` all_reduce over `nranks` needs at most: the segment is
// ceil(count/n) elements (less than ceil(bytes/n) + 8 bytes) rounded up to 16 bytes (the engine's
// two-shot segment), so less than ceil(bytes/n) + 23 bytes.
PYCOLL_HD int64_t ll128_lines_for(int64_t bytes, int nranks) {
  const int64_t seg = (bytes + nranks - 1) / nranks + 23;
  return (seg + kLL128LinePayload - 1) / kLL128LinePayload;
}

struct LL128Layout {
  int64_t max_lines = 0;   // lines per (sender, phase): ll128_lines_for(limit, nranks)
  int64_t off_epoch = 0;   // local: [block] u64, LL128 kernels CTA b has run on this rank
  int64_t off_header = 0;  // in dst: [sender index 0..n-2][kind][block] lines: kind 0 carries the
                           // check word, kind 1 is the ack of a CTA that has no result lines to send
  int64_t off_data = 0;    // in dst: [sender index][phase 0 scatter, 1 gather][max_lines] lines
  int64_t end = 0;         // one past the region's last byte

  PYCOLL_HD int64_t epoch_offset(int b) const { return off_epoch + int64_t(b) * 8; }
  PYCOLL_HD int64_t header_offset(int nranks, int src, int dst, int kind, int b) const {
    const int pidx = (src - dst - 1 + 2 * nranks) % nranks;
    return off_header + ((int64_t(pidx) * 2 + kind) * kLL128Blocks + b) * kLL128LineBytes;
  }
  // Line `line` of `phase` written by `src` into dst's workspace.
  PYCOLL_HD int64_t line_offset(int nranks, int src, int dst, int phase, int64_t line) const {
    const int pidx = (src - dst - 1 + 2 * nranks) % nranks;
    return off_data + ((int64_t(pidx) * 2 + phase) * max_lines + line) * kLL128LineBytes;
  }
};

// The region of `max_lines` lines per sender and phase starting at `base` (4 KiB aligned).
PYCOLL_HD LL128Layout ll128_layout(int64_t base, int64_t max_lines, int nranks) {
  const int64_t npeers = nranks - 1;
  LL128Layout L;
  L.max_lines = max_lines;
  L.off_epoch = base;
  L.off_header = base + (int64_t(kLL128Blocks) * 8 + 4095) / 4096 * 4096;
  L.off_data = L.off_header + npeers * 2 * kLL128Blocks * kLL128LineBytes;  // a multiple of 4 KiB
  L.end = L.off_data + npeers * 2 * max_lines * kLL128LineBytes;
  return L;
}

}  // namespace cuda_ipc
}  // namespace pycoll

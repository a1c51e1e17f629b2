// The LL128 two-shot all_reduce (cuda/kernels/ll128_two_shot.cuh; launcher: cuda/launch_ll128.cu),
// registered with the CUDA engine (cuda/all_reduce_registry.h): its settings, its limits, when it
// takes a two-shot call, and its workspace region (cuda/kernels/ll128_layout.h).
// docs/decisions/0010-ll128-two-shot.md, 0012-three-and-four-rank-all-reduce.md
#include <algorithm>
#include <string>

#include "common/arith.h"
#include "common/setting.h"
#include "cuda/all_reduce_plan.h"
#include "cuda/all_reduce_registry.h"
#include "cuda/engine_limits.h"
#include "cuda/kernels/ll128_layout.h"

namespace pycoll {
namespace gpu {
namespace {

using cuda_ipc::kLL128Blocks;
using cuda_ipc::kLL128LineBytes;
using cuda_ipc::kLL128LinePayload;

// Two-shot all_reduce of at most this many bytes runs with LL128 on two to four ranks: it beats
// the channel two-shot there (0010: two ranks 4-16 MiB; 0012: three and four ranks 512 KiB-16 MiB).
// More ranks: off, not measured. The workspace grows by about 2 x 1.07 x (n-1)/n of the limit.
constexpr int64_t kDefaultMaxBytes = int64_t(16) << 20;
// Each CTA takes at least a row of 64 lines of every segment.
constexpr int64_t kMinLinesPerBlock = 64;

constexpr const char* kScope = "cuda engine";
const IntSetting kMaxKiB("PYCOLL_CUDA_LL128_MAX_KIB", 0, 0, int64_t(1) << 20, kScope, true, Audience::Developer,
                         "Largest two-shot all_reduce (KiB) run with the LL128 protocol; 0 turns it off. The "
                         "workspace holds a whole message of this size. docs/decisions/0010-ll128-two-shot.md",
                         "2 to 4 ranks: 16 MiB; more ranks: 0");
const IntSetting kBlocks("PYCOLL_CUDA_LL128_BLOCKS", kLL128Blocks, 1, kLL128Blocks, kScope, true, Audience::Developer,
                         "CTAs of an LL128 kernel at most (never more than the SMs).");

ProtocolLimits read_limits(int nranks, int sms) {
  ProtocolLimits l;
  l.max_bytes = kMaxKiB.get_or(nranks >= 2 && nranks <= 4 ? kDefaultMaxBytes / 1024 : 0) * 1024;
  l.max_blocks = std::min<int>(sms, int(kBlocks.get()));
  return l;
}

SettingList agreement(const ProtocolLimits& l) {
  return {{kMaxKiB.name(), std::to_string(l.max_bytes / 1024)}, {kBlocks.name(), std::to_string(l.max_blocks)}};
}

// The whole message fits the region: every line of every segment has its own place.
bool plan(AllReducePlan& p, int64_t count, int64_t es, const EngineLimits& l, const ProtocolLimits& mine) {
  if (count * es > mine.max_bytes) return false;
  p.seg = two_shot_segment(count, es, l.nranks);
  const int64_t lines = ceil_div(std::min(p.seg, count) * es, kLL128LinePayload);
  p.grid = int(std::max<int64_t>(1, std::min<int64_t>(mine.max_blocks, lines / kMinLinesPerBlock)));
  return true;
}

// Lines of the largest segment against the lines per sender and phase the region holds.
bool fits(const AllReducePlan& p, int64_t count, int64_t es, int nranks, int index, const cuda_ipc::Layout& L) {
  const cuda_ipc::ProtocolRegion& region = L.regions[index];
  return region.bytes > 0 && p.grid >= 1 && p.grid <= kLL128Blocks &&
         ceil_div(std::min(p.seg, count) * es, kLL128LinePayload) <= region.param;
}

int64_t region_param(int nranks, const ProtocolLimits& l) { return cuda_ipc::ll128_lines_for(l.max_bytes, nranks); }

int64_t region_bytes(int nranks, const ProtocolLimits& l) {
  return cuda_ipc::ll128_layout(0, region_param(nranks, l), nranks).end;
}

// CTA 0's check header (kind 0) of each sender, whose flag is the call's epoch.
cuda_ipc::RegionProbe probe(int nranks, const ProtocolLimits& l) {
  const cuda_ipc::LL128Layout L = cuda_ipc::ll128_layout(0, region_param(nranks, l), nranks);
  cuda_ipc::RegionProbe p;
  p.epoch_off = L.epoch_offset(0);
  p.header_off = L.off_header;
  p.header_stride = 2 * kLL128Blocks * kLL128LineBytes;
  p.flag_byte = kLL128LinePayload;
  return p;
}

std::vector<RegionRange> ranges(int64_t base, int nranks, int me, const ProtocolLimits& l) {
  const cuda_ipc::LL128Layout L = cuda_ipc::ll128_layout(base, region_param(nranks, l), nranks);
  std::vector<RegionRange> out;
  for (int b = 0; b < kLL128Blocks; ++b) out.push_back({"ll128.epoch", L.epoch_offset(b), L.epoch_offset(b) + 8});
  for (int q = 0; q < nranks; ++q) {
    if (q == me) continue;
    for (int kind = 0; kind < 2; ++kind) {
      for (int b = 0; b < kLL128Blocks; ++b) {
        const int64_t h = L.header_offset(nranks, q, me, kind, b);
        out.push_back({"ll128.header", h, h + kLL128LineBytes});
      }
    }
    for (int phase = 0; phase < 2; ++phase) {  // one range per (sender, phase): every line
      const int64_t first = L.line_offset(nranks, q, me, phase, 0);
      out.push_back({"ll128.data", first, L.line_offset(nranks, q, me, phase, L.max_lines - 1) + kLL128LineBytes});
    }
  }
  return out;
}

AllReduceProtocol registration() {
  AllReduceProtocol p;
  p.name = cuda_ipc::kLL128ProtocolName;
  p.algos = algo_bit(Algo::TwoShot);
  p.check_code = 9;
  p.check_name = "two-shot (LL128 protocol)";
  p.read_limits = &read_limits;
  p.agreement = &agreement;
  p.plan = &plan;
  p.fits = &fits;
  p.region_bytes = &region_bytes;
  p.region_param = &region_param;
  p.probe = &probe;
  p.ranges = &ranges;
  return p;
}

[[maybe_unused]] const bool kRegistered = register_all_reduce_protocol(registration());

}  // namespace
}  // namespace gpu
}  // namespace pycoll

// The LL one-shot all_reduce (cuda/kernels/ll_all_reduce.cuh: 16-byte lines with the flag inside
// the data; launcher: cuda/launch_ll.cu), registered with the CUDA engine
// (cuda/all_reduce_registry.h): its setting, its limit and when it takes a one-shot call. Its
// lines are in the workspace's fixed layout (cuda_ipc::LLLayout), not in a region of its own:
// every channel wait reads its epochs (peer_in_next_ll_call).
// docs/decisions/0001-ll-protocol-small-all-reduce.md
#include <string>

#include "common/arith.h"
#include "common/setting.h"
#include "cuda/all_reduce_plan.h"
#include "cuda/all_reduce_registry.h"
#include "transport/cuda_ipc/layout.h"

namespace pycoll {
namespace gpu {
namespace {

// One-shot all_reduce of at most this many bytes runs with LL (0001).
constexpr int64_t kDefaultMaxBytes = int64_t(1) << 20;

const IntSetting kMaxKiB("PYCOLL_CUDA_LL_MAX_KIB", kDefaultMaxBytes / 1024, 0, cuda_ipc::kLLMaxBytes / 1024,
                         "cuda engine", true, Audience::Developer,
                         "Largest all_reduce (KiB) that the one-shot runs with the LL protocol; 0 turns LL off. "
                         "docs/decisions/0001-ll-protocol-small-all-reduce.md");

ProtocolLimits read_limits(int, int) { return {kMaxKiB.get() * 1024, cuda_ipc::kLLBlocks}; }

SettingList agreement(const ProtocolLimits& l) { return {{kMaxKiB.name(), std::to_string(l.max_bytes / 1024)}}; }

// One CTA per 16 KiB region of the LL buffers.
bool plan(AllReducePlan& p, int64_t count, int64_t es, const EngineLimits&, const ProtocolLimits& mine) {
  const int64_t bytes = count * es;
  if (bytes > mine.max_bytes) return false;
  p.check = cuda_ipc::CheckPlan::LL;
  p.grid = int(ceil_div(bytes, cuda_ipc::kLLBlockPayloadBytes));
  return true;
}

bool fits(const AllReducePlan& p, int64_t count, int64_t es, int, int, const cuda_ipc::Layout& L) {
  return p.grid >= 1 && p.grid <= L.ll.nblocks && count * es <= int64_t(p.grid) * cuda_ipc::kLLBlockPayloadBytes;
}

AllReduceProtocol registration() {
  AllReduceProtocol p;
  p.name = kLLProtocolName;
  p.algos = algo_bit(Algo::OneShot);
  p.priority = 1;
  p.read_limits = &read_limits;
  p.agreement = &agreement;
  p.plan = &plan;
  p.fits = &fits;
  return p;
}

[[maybe_unused]] const bool kRegistered = register_all_reduce_protocol(registration());

}  // namespace
}  // namespace gpu
}  // namespace pycoll

// The registry of all_reduce protocols: everything the CUDA engine needs to plan, size, compare
// and launch one, given in one registration next to its kernel. Every all_reduce runs through it:
// the LL one-shot (ll_all_reduce.cpp), the LL128 two-shot (ll128_two_shot.cpp) and the channel
// protocol that runs every schedule at any size (channel_all_reduce.cpp). The plan, the
// workspace layout, the ranks' agreement list, the check-word names, the early-launch check, the
// launch and the debug log iterate over this list, so adding a protocol touches no shared file
// (docs/adding-an-algorithm.md). Plain C++: the registrations are compiled in CPU-only builds
// too, so that plans and layouts are tested without a GPU; the launchers (CUDA) register
// themselves from their .cu file.
//
// Every rank of a group runs the same binary, so every rank sees the same list in the same order:
// plans and regions agree across ranks as the kernels require.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/settings_agreement.h"
#include "common/types.h"
#include "transport/cuda_ipc/layout.h"

namespace pycoll {
namespace kernels {
struct ReduceArgs;
}
namespace gpu {

struct AllReducePlan;
struct EngineLimits;

// What a protocol's settings allow on one engine (read once per engine, compared across ranks).
struct ProtocolLimits {
  int64_t max_bytes = 0;  // largest all_reduce it runs (0: off on this engine; kAnySize: no limit)
  int max_blocks = 0;     // CTAs of its kernel at most
};
constexpr int64_t kAnySize = INT64_MAX;

// The built-in protocols' names (their registrations and launchers meet under them; LL128's is
// cuda_ipc::kLL128ProtocolName).
constexpr const char* kChannelProtocolName = "channel";
constexpr const char* kLLProtocolName = "ll";

// A set of algorithms, one bit each.
constexpr uint32_t algo_bit(Algo a) { return uint32_t(1) << int(a); }

// A named byte range of a region, for the layout report (tests/test_cuda_layout.py checks that no
// two ranges of a workspace overlap).
struct RegionRange {
  std::string name;
  int64_t begin = 0, end = 0;
};

struct AllReduceProtocol {
  const char* name = "";  // the plan's protocol word ("ll128"): the log, the plan's report
  uint32_t algos = 0;     // the schedules it runs (algo_bit): it takes calls planned as one of them
  // Its cuda_ipc::CheckPlan code, an unused one of 9..13, and how a mismatch error names it
  // ("two-shot (LL128 protocol)"); 0 and "" where its plan sets one of the built-in codes.
  int check_code = 0;
  const char* check_name = "";
  int priority = 0;  // where several would take a call, the lowest first

  // Its limits on an engine of `nranks` ranks on GPUs of `sms` SMs, from its own settings.
  ProtocolLimits (*read_limits)(int nranks, int sms) = nullptr;
  // Its settings as the ranks must agree on them.
  SettingList (*agreement)(const ProtocolLimits&) = nullptr;
  // Fills the plan's mode, check, grid, segment and chunking when it takes this call (the engine
  // has already chosen `algo`), false to leave the call to the next protocol. A protocol of a
  // limited size should take every call of its algorithm up to its limit: the cost model
  // (choose_all_reduce) assumes so.
  bool (*plan)(AllReducePlan& p, int64_t count, int64_t elem_bytes, const EngineLimits& l,
               const ProtocolLimits& mine) = nullptr;
  // Whether the planned launch stays inside the workspace (its region: `layout.regions[index]`):
  // the engine checks it before every launch, so that a plan rule and a workspace that disagree
  // fail there instead of writing past them into a peer's memory.
  bool (*fits)(const AllReducePlan& p, int64_t count, int64_t elem_bytes, int nranks, int index,
               const cuda_ipc::Layout& layout) = nullptr;
  // Optional: what its kernel reads beyond the plan's fields (the engine has set those, the
  // buffers, the count and the check word), from this rank's place in the group (a.h.rank).
  void (*prepare)(kernels::ReduceArgs& a, const AllReducePlan& p) = nullptr;
  // Optional, all or none: its workspace region for these limits: size (0: none), the number its
  // kernel is given (cuda_ipc::ProtocolRegion::param), the mismatch probe (offsets from the
  // region's start; optional), and the ranges rank `me` holds (offsets from `base`). Without
  // them the protocol uses the workspace's fixed parts (the channels, the LL lines).
  int64_t (*region_bytes)(int nranks, const ProtocolLimits&) = nullptr;
  int64_t (*region_param)(int nranks, const ProtocolLimits&) = nullptr;
  cuda_ipc::RegionProbe (*probe)(int nranks, const ProtocolLimits&) = nullptr;
  std::vector<RegionRange> (*ranges)(int64_t base, int nranks, int me, const ProtocolLimits&) = nullptr;

  bool runs(Algo a) const { return (algos & algo_bit(a)) != 0; }
  bool has_region() const { return region_bytes != nullptr; }
};

// Adds a protocol (called from a static initializer of its registration). Raises std::logic_error
// for a second protocol of the same name or check code, a check code outside 9..13 (other than
// 0), a missing part, or more than cuda_ipc::kMaxProtocolRegions: a programming error, which ends
// the process with std::terminate when the extension is imported (static initialization cannot
// raise to Python).
bool register_all_reduce_protocol(const AllReduceProtocol& p);
// Every registered protocol, by priority and then name. The index into this list is the
// protocol's number in a plan (AllReducePlan::protocol), in EngineLimits::protocols and in the
// workspace layout's regions.
const std::vector<AllReduceProtocol>& all_reduce_protocols();
// The protocol's index, or -1.
int find_all_reduce_protocol(const std::string& name);

// The workspace regions of an engine with these limits, in the list's order (size 0 for a
// protocol without a region of its own, or off).
std::vector<cuda_ipc::ProtocolRegion> protocol_regions(const EngineLimits& l);

// The launcher of a protocol's kernel (registered from its .cu file; CUDA builds only). `stream`
// is a cudaStream_t; returns a cudaError_t.
struct AllReduceLauncher {
  int (*launch)(int grid, void* stream, const kernels::ReduceArgs& args, bool early) = nullptr;
  bool (*supports_early_launch)() = nullptr;  // compiled with its grid-dependency waits
};
bool register_all_reduce_launcher(const char* name, const AllReduceLauncher& l);
// Null when this build has no kernel for the protocol.
const AllReduceLauncher* all_reduce_launcher(int protocol);
// Every registered protocol has a launcher that may launch early.
bool registered_launchers_support_early_launch();

}  // namespace gpu
}  // namespace pycoll

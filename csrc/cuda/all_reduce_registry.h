// The registry of all_reduce protocols with a workspace region of their own (the LL128 two-shot is
// one): everything the CUDA engine needs to plan, size, compare and launch such a protocol, given in
// one registration next to its kernel. The plan, the workspace layout, the ranks' agreement list,
// the check-word names, the early-launch check and the debug log iterate over this list, so adding
// a protocol touches no shared file (docs/adding-an-algorithm.md). Plain C++: the registrations are
// compiled in CPU-only builds too, so that plans and layouts are tested without a GPU; the launchers
// (CUDA) register themselves from their .cu file.
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
  int64_t max_bytes = 0;  // largest all_reduce it runs (0: off on this engine)
  int max_blocks = 0;     // CTAs of its kernel at most
};

// A named byte range of a region, for the layout report (tests/test_cuda_layout.py checks that no
// two ranges of a workspace overlap).
struct RegionRange {
  std::string name;
  int64_t begin = 0, end = 0;
};

struct AllReduceProtocol {
  const char* name = "";        // the plan's protocol word ("ll128"): the log, the plan's report
  Algo algo = Algo::TwoShot;    // the schedule it runs: it takes calls planned as this algorithm
  int check_code = 0;           // its cuda_ipc::CheckPlan code: an unused one of 9..15
  const char* check_name = "";  // how a mismatch error names it: "two-shot (LL128 protocol)"
  int priority = 0;             // where several would take a call, the lowest first

  // Its limits on an engine of `nranks` ranks on GPUs of `sms` SMs, from its own settings.
  ProtocolLimits (*read_limits)(int nranks, int sms) = nullptr;
  // Its settings as the ranks must agree on them.
  SettingList (*agreement)(const ProtocolLimits&) = nullptr;
  // Fills the plan's grid, segment and chunking when it takes this call (the engine has already
  // chosen `algo`), false to leave the call to the channel protocol. It should take every call
  // of its algorithm up to its limit: the cost model (choose_all_reduce) assumes so.
  bool (*plan)(AllReducePlan& p, int64_t count, int64_t elem_bytes, const EngineLimits& l,
               const ProtocolLimits& mine) = nullptr;
  // Whether the planned launch stays inside its region (`param` as region_param gave it): the
  // engine checks it before every launch, so that a plan rule and a region size that disagree
  // fail there instead of writing past the region into a peer's workspace.
  bool (*fits)(const AllReducePlan& p, int64_t count, int64_t elem_bytes, int nranks,
               const cuda_ipc::ProtocolRegion& region) = nullptr;
  // Its workspace region for these limits: size (0: none), the number its kernel is given
  // (cuda_ipc::ProtocolRegion::param), the mismatch probe (offsets from the region's start), and
  // the ranges rank `me` holds (offsets from `base`).
  int64_t (*region_bytes)(int nranks, const ProtocolLimits&) = nullptr;
  int64_t (*region_param)(int nranks, const ProtocolLimits&) = nullptr;
  cuda_ipc::RegionProbe (*probe)(int nranks, const ProtocolLimits&) = nullptr;
  std::vector<RegionRange> (*ranges)(int64_t base, int nranks, int me, const ProtocolLimits&) = nullptr;
};

// Adds a protocol (called from a static initializer of its registration). Raises std::logic_error
// for a second protocol of the same name or check code, a check code outside 9..15, a missing
// part, or more than cuda_ipc::kMaxProtocolRegions: a programming error, which ends the process
// with std::terminate when the extension is imported (static initialization cannot raise to Python).
bool register_all_reduce_protocol(const AllReduceProtocol& p);
// Every registered protocol, by priority and then name. The index into this list is the
// protocol's number in a plan (AllReducePlan::registered), in EngineLimits::protocols and in the
// workspace layout's regions.
const std::vector<AllReduceProtocol>& all_reduce_protocols();
// The protocol's index, or -1.
int find_all_reduce_protocol(const std::string& name);

// The workspace regions of an engine with these limits, in the list's order.
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

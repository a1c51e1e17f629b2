#include "cuda/cuda_settings.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "cuda/select.h"
#include "transport/cuda_ipc/layout.h"

namespace pycoll::cuda_settings {

namespace {
constexpr const char* kScope = "cuda engine";
constexpr int64_t kMaxKiB = 16384;
}  // namespace

const IntSetting kMaxBlocks("PYCOLL_CUDA_MAX_BLOCKS", gpu::kDefaultMaxBlocks, 1, cuda_ipc::kMaxCollBlocks, kScope, true,
                            Audience::Developer,
                            "CTAs one collective uses at most (never more than the GPU's SMs); above the workspace's "
                            "channel count the workspace grows with it. Also caps the two-shot unless "
                            "PYCOLL_CUDA_TWO_SHOT_BLOCKS is set.");
const IntSetting kSmallMaxBlocks("PYCOLL_CUDA_SMALL_MAX_BLOCKS", gpu::kSmallMaxBlocks, 1, cuda_ipc::kMaxCollBlocks,
                                 kScope, true, Audience::Developer,
                                 "The same cap for messages up to gpu::kSmallMessageBytes.");
const IntSetting kSlotKiB("PYCOLL_CUDA_SLOT_KIB", 0, 0, kMaxKiB, kScope, true, Audience::Developer,
                          "Collective slot size in KiB; 0 = by world size (transport/cuda_ipc/layout.h).",
                          "0 (by world size)", false, 4);
const IntSetting kChunkKiB("PYCOLL_CUDA_CHUNK_KIB", 0, 0, kMaxKiB, kScope, true, Audience::Developer,
                           "Largest chunk one CTA step moves, in KiB; 0 = the slot size (and the cap).",
                           "0 (the slot size)", false, 4);
const IntSetting kSplitMinKiB("PYCOLL_CUDA_SPLIT_MIN_KIB", gpu::kDefaultSplitMinBytes / 1024, 0, int64_t(1) << 40,
                              kScope, true, Audience::Developer,
                              "Two ranks: a one-shot all_reduce of at least this many KiB runs split (pushing and "
                              "reducing CTAs apart). docs/decisions/0004-split-one-shot.md");
const IntSetting kSplitChunkKiB("PYCOLL_CUDA_SPLIT_CHUNK_KIB", 0, 0, kMaxKiB, kScope, true, Audience::Developer,
                                "Chunk of the split one-shot in KiB; 0 = the measured default of the claimed or "
                                "static split.",
                                "0 (measured default)", false, 4);
const IntSetting kSplitTaper("PYCOLL_CUDA_SPLIT_TAPER", 1, 0, 1, kScope, true, Audience::Developer,
                             "1: the split one-shot cuts each channel's last chunk at half a chunk. "
                             "docs/decisions/0004-split-one-shot.md");
const IntSetting kSplitClaimed("PYCOLL_CUDA_SPLIT_CLAIMED", 1, 0, 1, kScope, true, Audience::Developer,
                               "1: the split one-shot's pushers claim chunks from one counter. "
                               "docs/decisions/0008-claimed-split.md");
const IntSetting kTwoShotWaves("PYCOLL_CUDA_TWO_SHOT_WAVES", 1, 0, 1, kScope, true, Audience::Developer,
                               "1: the two-shot all_reduce starts half of its CTAs after the other half. "
                               "docs/decisions/0009-two-shot-waves.md",
                               "1 for two ranks, else 0");
const IntSetting kTwoShotBlocks("PYCOLL_CUDA_TWO_SHOT_BLOCKS", gpu::kTwoRankWideTwoShotBlocks, 0,
                                cuda_ipc::kMaxCollBlocks, kScope, true, Audience::Developer,
                                "CTAs of a two-rank two-shot all_reduce with waves up to "
                                "gpu::kTwoRankWideTwoShotMaxBytes; 0 = the PYCOLL_CUDA_MAX_BLOCKS cap.",
                                "128 (0 when PYCOLL_CUDA_MAX_BLOCKS is set)");
const IntSetting kP2PMaxBlocks("PYCOLL_CUDA_P2P_MAX_BLOCKS", gpu::kP2PMaxBlocks, 1, gpu::kP2PMaxBlocks, kScope, true,
                               Audience::Developer,
                               "CTAs one send or receive uses at most (never more than the p2p channels or half the "
                               "SMs less 4). A receive posted before its send holds them while it waits. "
                               "docs/decisions/0011-p2p-channels.md");
const IntSetting kP2PSlotKiB("PYCOLL_CUDA_P2P_SLOT_KIB", 0, 0, kMaxKiB, kScope, true, Audience::Developer,
                             "Point-to-point slot size in KiB (the largest chunk of a send/recv); 0 = by world "
                             "size (512 KiB for two ranks; transport/cuda_ipc/layout.h). "
                             "docs/decisions/0017-p2p-large-slots-and-all-to-all-own-slice.md",
                             "0 (by world size)", false, 4);
const IntSetting kEarlyLaunch("PYCOLL_CUDA_EARLY_LAUNCH", 1, 0, 1, kScope, false, Audience::Developer,
                              "1: collective kernels use programmatic dependent launch (sm_90+), so back-to-back "
                              "collectives do not wait for a full launch. docs/decisions/0005-early-launch.md",
                              "1 on sm_90 and later, else 0");
const IntSetting kTrace("PYCOLL_CUDA_TRACE", 0, 0, 1, kScope, false, Audience::Developer,
                        "1: kernels that support it record their timeline in the workspace "
                        "(pycollectives cuda_trace(); cuda/kernels/trace.cuh).");
const TextSetting kSameDevice("PYCOLL_CUDA_SAME_DEVICE", "auto", "auto, staged, kernels, events", kScope, true,
                              Audience::User,
                              "Ranks of a group that share one GPU: auto runs all_reduce, reduce_scatter, all_gather "
                              "and broadcast of a group whose ranks all share one GPU as events does from "
                              "PYCOLL_CUDA_SAME_DEVICE_STAGED_BELOW_KIB up and everything else as staged; staged runs "
                              "the group's CUDA ops through host memory and the CPU engine; kernels maps their "
                              "workspaces with CUDA IPC and runs the engine's kernels (time-sliced between the "
                              "processes unless the MPS daemon runs; correct, not fast); events runs those four ops "
                              "with no kernel waiting on another process (streams ordered by CUDA IPC events, "
                              "cuda/same_device_path.h) at every size and the other ops as kernels does. "
                              "docs/using-gpus.md");
const IntSetting kSameDeviceStagingKiB(
    "PYCOLL_CUDA_SAME_DEVICE_STAGING_KIB", 65536, 4, int64_t(1) << 22, kScope, true, Audience::Developer,
    "PYCOLL_CUDA_SAME_DEVICE=events or auto: each rank's staging buffer in KiB (device memory every peer maps); a "
    "larger message takes one round per buffer. cuda/same_device_path.h",
    nullptr, false, 4);
const IntSetting kSameDeviceStagedBelowKiB(
    "PYCOLL_CUDA_SAME_DEVICE_STAGED_BELOW_KIB", -1, -1, int64_t(1) << 22, kScope, true, Audience::User,
    "PYCOLL_CUDA_SAME_DEVICE=auto: messages below this many KiB (the op's output, alike on every rank) stage "
    "through host memory, larger ones take the events path; -1 measures a handoff between the ranks' streams "
    "when the group starts: 1024 where it takes over 100 us (no MPS daemon), 0 where it is faster (MPS). "
    "docs/using-gpus.md",
    "-1 (measured)");

SameDeviceMode same_device_mode() {
  std::string v = kSameDevice.get();
  v.erase(std::remove_if(v.begin(), v.end(), [](unsigned char c) { return std::isspace(c) != 0; }), v.end());
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (v == "kernels") return SameDeviceMode::Kernels;
  if (v == "events") return SameDeviceMode::Events;
  if (v == "staged") return SameDeviceMode::Staged;
  TORCH_CHECK_VALUE(v == "auto", "pycoll: ", kSameDevice.name(), "=", kSameDevice.get(),
                    " is not valid: it must be one of auto, staged, kernels, events");
  return SameDeviceMode::Auto;
}

const char* same_device_mode_name(SameDeviceMode m) {
  switch (m) {
    case SameDeviceMode::Kernels: return "kernels";
    case SameDeviceMode::Events: return "events";
    case SameDeviceMode::Staged: return "staged";
    case SameDeviceMode::Auto: break;
  }
  return "auto";
}

}  // namespace pycoll::cuda_settings

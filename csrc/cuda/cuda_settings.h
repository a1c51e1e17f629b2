// The CUDA engine's settings (common/setting.h), read once per engine in its constructor (a
// registered all_reduce protocol declares its own next to its registration). They
// shape the workspace and the launches, so every rank must use the same values (the engine
// compares them before the first launch). Compiled into CPU-only builds too, so that
// pycollectives.settings() lists them everywhere.
#pragma once

#include "common/setting.h"

namespace pycoll::cuda_settings {

extern const IntSetting kMaxBlocks;
extern const IntSetting kSmallMaxBlocks;
extern const IntSetting kSlotKiB;
extern const IntSetting kChunkKiB;
extern const IntSetting kSplitMinKiB;
extern const IntSetting kSplitChunkKiB;
extern const IntSetting kSplitTaper;
extern const IntSetting kSplitClaimed;
extern const IntSetting kTwoShotWaves;
extern const IntSetting kTwoShotBlocks;
extern const IntSetting kP2PMaxBlocks;
extern const IntSetting kP2PSlotKiB;
extern const IntSetting kEarlyLaunch;
extern const IntSetting kTrace;
extern const TextSetting kSameDevice;
extern const IntSetting kSameDeviceStagingKiB;
extern const IntSetting kSameDeviceStagedBelowKiB;

// PYCOLL_CUDA_SAME_DEVICE, parsed: auto (the main collectives of a group whose ranks all share one
// GPU run cuda/same_device_path.h from a measured size up, everything else stages through host
// memory; no kernel ever waits on another process), staged (ranks that share a GPU stage through
// host memory), kernels (they map each other's workspace and run the engine's kernels), events (as
// kernels, except that the main collectives run cuda/same_device_path.h at every size). Any other
// value raises ValueError naming the setting and its values.
enum class SameDeviceMode { Auto, Staged, Kernels, Events };
SameDeviceMode same_device_mode();
const char* same_device_mode_name(SameDeviceMode m);

}  // namespace pycoll::cuda_settings

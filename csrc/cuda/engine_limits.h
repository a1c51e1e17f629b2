// What the CUDA engine's settings allow on one GPU, resolved once per engine from the settings
// (cuda_settings.h), the world size and the SM count. The plans (all_reduce_plan.h) read only
// these, so a plan depends on nothing a rank could see differently from its peers: the engine
// compares every field across ranks before the first launch (agreement_list). Plain C++.
#pragma once

#include <cstdint>
#include <vector>

#include "common/settings_agreement.h"
#include "cuda/all_reduce_registry.h"

namespace pycoll {
namespace gpu {

struct EngineLimits {
  int nranks = 1;
  int sms = 0;                      // every CTA of a collective must be resident at once
  int max_blocks = 1;               // CTAs of a collective (PYCOLL_CUDA_MAX_BLOCKS, at most the SMs)
  int small_max_blocks = 1;         // ... up to kSmallMessageBytes (PYCOLL_CUDA_SMALL_MAX_BLOCKS)
  int workspace_blocks = 0;         // channels per peer pair the workspace holds (make_layout)
  int64_t slot_bytes = 0;           // one collective slot (make_layout)
  int64_t chunk_bytes = 0;          // largest chunk of one CTA step, at most a slot
  bool chunk_set = false;           // PYCOLL_CUDA_CHUNK_KIB given
  int64_t split_min_bytes = 0;      // two ranks: one-shot from here runs split
  int64_t split_chunk_bytes = 0;    // ... static split's chunk
  int64_t claimed_chunk_bytes = 0;  // ... claimed split's chunk
  bool split_taper = true;
  bool split_claimed = true;
  bool two_shot_waves = false;
  int two_shot_wide_blocks = 0;  // two_shot_max_blocks()
  int p2p_max_blocks = 1;        // CTAs of one send or receive (PYCOLL_CUDA_P2P_MAX_BLOCKS)
  int64_t p2p_slot_bytes = 0;    // one p2p slot (make_layout; PYCOLL_CUDA_P2P_SLOT_KIB)
  // The registered protocols' own limits, in all_reduce_protocols() order.
  std::vector<ProtocolLimits> protocols;
};

// The largest all_reduce that a protocol of a limited size runs as `algo` on this engine (0:
// none): the cost model counts such a protocol's speed for `algo` up to there (select.h).
int64_t limited_protocol_max_bytes(const EngineLimits& l, Algo algo);

// The workspace an engine with these limits maps (what cuda_ipc::IpcWorkspace lays out).
cuda_ipc::Layout workspace_layout(const EngineLimits& l);

// Reads the settings, the registered protocols' included (a bad value raises, naming the setting
// and its range).
EngineLimits read_engine_limits(int nranks, int sms);

// The fields, named by the setting that sets each, for the ranks' agreement check.
SettingList agreement_list(const EngineLimits& l);

}  // namespace gpu
}  // namespace pycoll

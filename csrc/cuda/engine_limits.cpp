#include "cuda/engine_limits.h"

#include <algorithm>
#include <string>

#include "cuda/cuda_settings.h"
#include "cuda/select.h"
#include "transport/cuda_ipc/layout.h"

namespace pycoll {
namespace gpu {

EngineLimits read_engine_limits(int nranks, int sms) {
  using namespace cuda_settings;
  EngineLimits l;
  l.nranks = nranks;
  l.sms = sms;
  l.max_blocks = std::max(1, std::min(int(kMaxBlocks.get()), sms));
  l.small_max_blocks = int(cuda_settings::kSmallMaxBlocks.get());
  l.split_min_bytes = kSplitMinKiB.get() * 1024;
  l.split_taper = kSplitTaper.get() != 0;
  l.split_claimed = kSplitClaimed.get() != 0;
  l.two_shot_waves = kTwoShotWaves.get_or(nranks == 2 ? 1 : 0) != 0;
  // A set PYCOLL_CUDA_MAX_BLOCKS caps two-shot too, unless PYCOLL_CUDA_TWO_SHOT_BLOCKS says otherwise.
  l.two_shot_wide_blocks =
      std::min<int>(sms, int(kTwoShotBlocks.get_or(kMaxBlocks.is_set() ? 0 : kTwoRankWideTwoShotBlocks)));
  l.p2p_max_blocks = int(cuda_settings::kP2PMaxBlocks.get());
  const int64_t p2p_slot_kib = kP2PSlotKiB.get();
  l.p2p_slot_bytes = p2p_slot_kib > 0 ? p2p_slot_kib * 1024 : cuda_ipc::p2p_slot_bytes_for(nranks);
  for (const AllReduceProtocol& p : all_reduce_protocols()) l.protocols.push_back(p.read_limits(nranks, sms));

  l.workspace_blocks = std::max({cuda_ipc::kCollBlocks, l.max_blocks, nranks == 2 ? l.two_shot_wide_blocks : 0});
  const int64_t slot_kib = kSlotKiB.get();
  l.slot_bytes = slot_kib > 0 ? slot_kib * 1024 : cuda_ipc::coll_slot_bytes_for(nranks, l.workspace_blocks);
  const int64_t chunk_kib = kChunkKiB.get();
  l.chunk_bytes = chunk_kib > 0 ? std::min<int64_t>(chunk_kib * 1024, l.slot_bytes) : l.slot_bytes;
  l.chunk_set = chunk_kib > 0;
  const int64_t split_chunk_kib = kSplitChunkKiB.get();
  l.split_chunk_bytes =
      std::min<int64_t>(split_chunk_kib > 0 ? split_chunk_kib * 1024 : kDefaultSplitChunkBytes, l.slot_bytes);
  l.claimed_chunk_bytes =
      std::min<int64_t>(split_chunk_kib > 0 ? split_chunk_kib * 1024 : kDefaultClaimedChunkBytes, l.slot_bytes);
  return l;
}

cuda_ipc::Layout workspace_layout(const EngineLimits& l) {
  const std::vector<cuda_ipc::ProtocolRegion> regions = protocol_regions(l);
  return cuda_ipc::make_layout(l.nranks, l.slot_bytes, l.workspace_blocks, regions.data(), int(regions.size()),
                               l.p2p_slot_bytes);
}

SettingList agreement_list(const EngineLimits& l) {
  using namespace cuda_settings;
  auto s = [](int64_t v) { return std::to_string(v); };
  SettingList list = {
      {"GPU SM count", s(l.sms)},
      {kMaxBlocks.name(), s(l.max_blocks)},
      {cuda_settings::kSmallMaxBlocks.name(), s(l.small_max_blocks)},
      {std::string(kSlotKiB.name()) + " (slot bytes)", s(l.slot_bytes)},
      {std::string(kChunkKiB.name()) + " (chunk bytes)", s(l.chunk_bytes)},
      {kSplitMinKiB.name(), s(l.split_min_bytes / 1024)},
      {std::string(kSplitChunkKiB.name()) + " (static, claimed chunk bytes)",
       s(l.split_chunk_bytes) + ", " + s(l.claimed_chunk_bytes)},
      {kSplitTaper.name(), s(l.split_taper)},
      {kSplitClaimed.name(), s(l.split_claimed)},
      {kTwoShotWaves.name(), s(l.two_shot_waves)},
      {kTwoShotBlocks.name(), s(l.two_shot_wide_blocks)},
      {cuda_settings::kP2PMaxBlocks.name(), s(l.p2p_max_blocks)},
      {std::string(kP2PSlotKiB.name()) + " (p2p slot bytes)", s(l.p2p_slot_bytes)},
  };
  const auto& protocols = all_reduce_protocols();
  for (size_t i = 0; i < protocols.size(); ++i)
    for (auto& kv : protocols[i].agreement(l.protocols.at(i))) list.push_back(std::move(kv));
  return list;
}

int64_t limited_protocol_max_bytes(const EngineLimits& l, Algo algo) {
  int64_t most = 0;
  const auto& protocols = all_reduce_protocols();
  for (size_t i = 0; i < protocols.size(); ++i) {
    const int64_t limit = l.protocols.at(i).max_bytes;
    if (protocols[i].runs(algo) && limit != kAnySize) most = std::max(most, limit);
  }
  return most;
}

}  // namespace gpu
}  // namespace pycoll

// Settings that every rank of a group must share because each rank derives its kernel launches
// from them (e.g. PYCOLL_CUDA_MAX_BLOCKS sets how a message is cut into chunks). A rank that
// differs would exchange messages of other shapes than its peers expect: the check word catches
// some of that only mid-collective, some not at all. Instead every rank publishes its settings
// through the store when its engine starts, and every rank compares them all and fails with the
// setting and the ranks that differ. Plain C++.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace pycoll {

using SettingList = std::vector<std::pair<std::string, std::string>>;  // (name, value), in order

// "name=value" lines.
std::string encode_settings(const SettingList& settings);

// Empty when every rank's encoded settings agree; otherwise one line per setting that differs,
// e.g. "PYCOLL_CUDA_MAX_BLOCKS: rank 0 has 64, rank 1 has 32". A setting missing on a rank reads
// "(unset)" there.
std::string settings_disagreement(const std::vector<std::string>& encoded_per_rank);

}  // namespace pycoll

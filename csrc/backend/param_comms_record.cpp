#include "backend/param_comms_record.h"

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>

#include <cstring>
#include <utility>

namespace pycoll {

namespace {

// Start and stride of the group's global ranks, as torch's backends report them: stride -1 where
// the ranks are not evenly spaced (the record has no field for the list itself).
std::pair<int, int> rank_start_and_stride(const std::vector<int64_t>& ranks) {
  if (ranks.empty()) return {0, 1};
  const int64_t stride = ranks.size() > 1 ? ranks[1] - ranks[0] : 1;
  for (size_t i = 1; i < ranks.size(); ++i)
    if (ranks[i] - ranks[i - 1] != stride) return {static_cast<int>(ranks[0]), -1};
  return {static_cast<int>(ranks[0]), static_cast<int>(stride)};
}

}  // namespace

bool ParamCommsRecord::profiling() { return at::hasCallbacks(); }

ParamCommsRecord::ParamCommsRecord(const std::function<ParamCommsCall()>& describe) {
  if (!profiling()) return;
  auto record = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (!record->isActive()) return;
  const ParamCommsCall c = describe();
  const auto [start, stride] = rank_start_and_stride(c.global_ranks);
  auto info = std::make_shared<torch::ParamCommsDebugInfo>(
      std::make_tuple(c.group_name, c.group_desc), c.rank, std::string(c.op), c.in_elems, c.out_elems, c.dtype,
      c.in_splits, c.out_splits, start, stride, c.size, c.async_op);
  info->setSequenceInfo(c.seq, c.p2p);
  // The profiler reads the debug info when the event ends, on this thread: installed first,
  // removed last (members are destroyed in reverse order).
  debug_info_ = std::make_unique<c10::DebugInfoGuard>(c10::DebugInfoKind::PARAM_COMMS_INFO, std::move(info));
  inputs_ = {c10::IValue(c.seq),       c10::IValue(std::make_tuple(c.group_name, c.group_desc)),
             c10::IValue(c.rank),      c10::IValue(std::string(c.op)),
             c10::IValue(c.in_splits), c10::IValue(c.out_splits),
             c10::IValue(start),       c10::IValue(stride),
             c10::IValue(c.size),      c10::IValue(false)};
  record->before(at::kParamCommsCallName, c10::ArrayRef<const c10::IValue>(inputs_.data(), inputs_.size()));
  record_ = std::move(record);
}

ParamCommsRecord::~ParamCommsRecord() {
  record_.reset();  // ends the event while the debug info is still installed
  debug_info_.reset();
}

}  // namespace pycoll

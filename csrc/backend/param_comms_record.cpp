#include "backend/param_comms_record.h"

#include <ATen/record_function.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
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

// torch's record grew over releases: the op's async flag and its sequence numbers are given where
// this torch's ParamCommsDebugInfo takes them (older ones: the fields are absent from the trace).
template <typename Info, typename = void>
struct HasSequenceInfo : std::false_type {};
template <typename Info>
struct HasSequenceInfo<Info, std::void_t<decltype(std::declval<Info&>().setSequenceInfo(uint64_t{}, false))>>
    : std::true_type {};

// A template, so that the branch this torch cannot compile is discarded.
template <typename Info>
std::shared_ptr<Info> param_comms_info(const ParamCommsCall& c, int start, int stride) {
  std::shared_ptr<Info> info;
  if constexpr (std::is_constructible_v<Info, std::tuple<std::string, std::string>, int, std::string, int64_t, int64_t,
                                        at::ScalarType, std::vector<int64_t>, std::vector<int64_t>, int, int, int,
                                        bool>) {
    info = std::make_shared<Info>(std::make_tuple(c.group_name, c.group_desc), c.rank, std::string(c.op), c.in_elems,
                                  c.out_elems, c.dtype, c.in_splits, c.out_splits, start, stride, c.size, c.async_op);
  } else {
    info = std::make_shared<Info>(std::make_tuple(c.group_name, c.group_desc), c.rank, std::string(c.op), c.in_elems,
                                  c.out_elems, c.dtype, c.in_splits, c.out_splits, start, stride, c.size);
  }
  if constexpr (HasSequenceInfo<Info>::value) info->setSequenceInfo(c.seq, c.p2p);
  return info;
}

}  // namespace

ParamCommsRecord::ParamCommsRecord(const std::function<ParamCommsCall()>& describe) {
  // The check the RECORD_FUNCTION macros make: this thread's cached callbacks (an atomic version
  // compare), where at::hasCallbacks() would lock the global callback list on every op.
  std::optional<at::StepCallbacks> callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
  if (!callbacks) return;
  auto record = std::make_unique<at::RecordFunction>(std::move(*callbacks));
  if (!record->isActive()) return;
  const ParamCommsCall c = describe();
  const auto [start, stride] = rank_start_and_stride(c.global_ranks);
  auto info = param_comms_info<torch::ParamCommsDebugInfo>(c, start, stride);
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

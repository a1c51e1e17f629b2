// torch.profiler's communication record around one pycoll call: a `record_param_comms` event with
// the metadata ProcessGroupNCCL and ProcessGroupGloo attach (collective name, element counts,
// dtype, group name, description and ranks, sequence number), which trace tools read (Holistic
// Trace Analysis, the profiler's comms view). Made only while a RecordFunction callback is
// registered (a profiler records), so an ordinary call pays one check.
//
// Unlike torch's RECORD_PARAM_COMMS_DATA it passes no tensors as the event's inputs: the sizes
// travel in the debug info, and the call's tensor lists stay out of the profiler's hands.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace at {
class RecordFunction;
}
namespace c10 {
class DebugInfoGuard;
}

namespace pycoll {

struct ParamCommsCall {
  std::string group_name, group_desc;
  int rank = 0, size = 0;
  const char* op = "";  // "allreduce": the call's name without the "pycoll::" prefix
  int64_t in_elems = 0, out_elems = 0;
  at::ScalarType dtype = at::kByte;
  std::vector<int64_t> in_splits, out_splits;
  std::vector<int64_t> global_ranks;  // group rank -> global rank; empty: the group is the world
  int64_t seq = 0;
  bool p2p = false;
  bool async_op = false;
};

class ParamCommsRecord {
 public:
  // Starts the record when a profiler records; else does nothing.
  explicit ParamCommsRecord(const std::function<ParamCommsCall()>& describe);
  ~ParamCommsRecord();
  ParamCommsRecord(const ParamCommsRecord&) = delete;
  ParamCommsRecord& operator=(const ParamCommsRecord&) = delete;

 private:
  std::unique_ptr<c10::DebugInfoGuard> debug_info_;
  std::vector<c10::IValue> inputs_;  // the event's inputs: the record refers to them until it ends
  std::unique_ptr<at::RecordFunction> record_;
};

}  // namespace pycoll

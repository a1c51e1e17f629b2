#include "common/issuing_op.h"

namespace pycoll {

namespace {
thread_local uint64_t this_thread_op = 0;
}  // namespace

uint64_t issuing_op() { return this_thread_op; }

IssuingOp::IssuingOp(uint64_t record_id) : previous_(this_thread_op) { this_thread_op = record_id; }

IssuingOp::~IssuingOp() { this_thread_op = previous_; }

}  // namespace pycoll

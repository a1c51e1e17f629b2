// What a kernel needs to reach the symmetric workspace of every rank: a plain struct passed to
// kernels by value (the MSCCL++ "DeviceHandle" pattern). The host class IpcWorkspace fills it.
// No torch, no CUDA headers.
#pragma once

#include <cstdint>

#include "transport/cuda_ipc/layout.h"

namespace pycoll {
namespace cuda_ipc {

// Error codes a kernel can report (HostErrorRecord::code).
enum DeviceErrorCode : int32_t {
  kErrNone = 0,
  kErrTimeout = 1,       // a bounded spin-wait expired: the peer never arrived
  kErrPeerAborted = 2,   // a peer reported an error first and told this rank to stop
  kErrSizeMismatch = 3,  // p2p: the sender's message length differs from the receive's
  kErrOpMismatch = 4,    // a peer called a different collective, size, dtype, op or root (check_word.h)
};

// Which wait expired (HostErrorRecord::where).
enum WaitKind : int32_t {
  kWaitCredit = 1,  // waiting for the receiver to free a slot (head)
  kWaitData = 2,    // waiting for the sender to fill a slot (tail)
  kWaitLocal = 3,   // split one-shot: waiting for this rank's pushing CTA to read its input
};

// First error seen by any kernel of this rank, written by the device into host-mapped memory.
// `code` is written last (after a system fence): once the host reads it non-zero, the other
// fields are complete.
struct HostErrorRecord {
  int32_t code;
  int32_t rank;
  int32_t peer;
  int32_t block;
  int32_t op;     // pycoll::OpCode, or 0 for send/recv
  int32_t where;  // WaitKind
  uint64_t expected;
  uint64_t observed;
  uint64_t waited_ns;
  // Host side only: the abort word that IpcWorkspace::abort() copies into this rank's workspace
  // (pinned, so the copy needs no staging and runs on a copy engine while kernels hold every SM).
  uint32_t abort_source;
  // Host side only: the word IpcWorkspace::stop_group() copies into every rank's workspace.
  uint32_t peer_stop_word;
};

struct DeviceHandle {
  int32_t rank = 0;
  int32_t nranks = 1;
  char* base[kMaxRanks] = {};  // workspace of every rank, mapped in this process (own included)
  Layout layout;
  uint64_t timeout_ns = 0;         // bound of every spin-wait
  HostErrorRecord* err = nullptr;  // device alias of the host-mapped record
  // PYCOLL_CUDA_TRACE: this launch's slot of the host-mapped trace ring (kTraceCtas x kTraceEvents
  // stamps, layout.h: trace_index), set per traced launch; null when the launch is not traced.
  uint64_t* trace = nullptr;
  uint64_t trace_launch = 0;  // the launch `trace` was claimed for: each CTA's start writes it
};

}  // namespace cuda_ipc
}  // namespace pycoll

// An asynchronous staged op of CUDA tensors (copied to the host, reduced there, copied back) in
// stream order, as NCCL's ops are: its Future completes when the op is issued, on a stream that
// waits for the op, so callbacks run at once on the issuing thread. Without that a Future would
// complete later on a pool thread, and a callback that issues the next collective (torch's
// PowerSGD hook does) would issue it at a time that differs between ranks: the group's ops would
// be called in different orders. Ranks sharing one GPU stage their small ops (auto mode).
//
// How: each op has a slot in a ring of 32-bit words in device memory. At issue the done stream
// waits (cuStreamWaitValue32, a wait in the stream's front end: no kernel, no SM) until the slot
// holds the op's number; the executor copies on the copy stream, which first waits for the
// caller's stream as it was at issue, and after its last copy writes the number into the slot
// there (cuStreamWriteValue32). The number is written on failure too, so no stream waits forever
// (the op's Work reports the error, and the group's next op raises it).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "backend/cuda_event_pool.h"
#include "backend/device_queue.h"

namespace pycoll {

class CudaStagedOrder : public std::enable_shared_from_this<CudaStagedOrder> {
 public:
  // Null where the driver has no stream memory operations (the backend then completes the Future
  // when the op has run, as for CPU tensors). Tickets keep it alive.
  static std::shared_ptr<CudaStagedOrder> make(int device);
  ~CudaStagedOrder();
  CudaStagedOrder(const CudaStagedOrder&) = delete;
  CudaStagedOrder& operator=(const CudaStagedOrder&) = delete;

  // At issue, on the issuing thread, with `caller` the caller's current stream (not capturing).
  std::shared_ptr<StagedTicket> issue(cudaStream_t caller);

 private:
  class Ticket;
  struct Driver;
  CudaStagedOrder(int device, const Driver& driver);
  c10::Stream stream(cudaStream_t s) const;
  CUdeviceptr slot(uint32_t number) const;

  static constexpr uint32_t kSlots = 1024;  // ops in flight at once, at most (the executor runs one at a time)
  int device_;
  const Driver& driver_;
  at::Tensor slots_;  // kSlots int32 words, zero at first
  cudaStream_t copy_stream_ = nullptr;
  cudaStream_t done_stream_ = nullptr;
  EventPool events_;
  std::mutex mu_;  // issue() order: numbers and the done stream's waits in the same order
  uint32_t issued_ = 0;
};

}  // namespace pycoll

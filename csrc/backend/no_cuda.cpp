// A build without CUDA has no device queue: CUDA tensors go through host memory (StagedEngine).
#ifndef PYCOLL_WITH_CUDA
#include "backend/device_queue.h"

namespace pycoll {

std::unique_ptr<DeviceQueue> make_cuda_queue(c10::intrusive_ptr<c10d::Store>, std::string, int, int,
                                             std::chrono::milliseconds) {
  return nullptr;
}

}  // namespace pycoll
#endif

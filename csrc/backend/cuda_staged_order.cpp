#include "backend/cuda_staged_order.h"

#include <c10/cuda/CUDAGuard.h>
#include <cuda.h>

#include <map>
#include <vector>

#include "common/cuda_check.h"

namespace pycoll {

// cuStreamWaitValue32 and cuStreamWriteValue32, found through the runtime (the extension does not
// link the driver library).
struct CudaStagedOrder::Driver {
  using ValueOp = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  ValueOp wait = nullptr;
  ValueOp write = nullptr;

  static const Driver& get() {
    static const Driver d = [] {
      Driver d;
      void* w = nullptr;
      void* x = nullptr;
      cudaDriverEntryPointQueryResult qw = cudaDriverEntryPointSymbolNotFound, qx = cudaDriverEntryPointSymbolNotFound;
      if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &w, 12000, cudaEnableDefault, &qw) == cudaSuccess &&
          cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &x, 12000, cudaEnableDefault, &qx) == cudaSuccess &&
          qw == cudaDriverEntryPointSuccess && qx == cudaDriverEntryPointSuccess) {
        d.wait = reinterpret_cast<ValueOp>(w);
        d.write = reinterpret_cast<ValueOp>(x);
      }
      (void)cudaGetLastError();  // a failed lookup leaves no error behind for the caller's next call
      return d;
    }();
    return d;
  }
};

class CudaStagedOrder::Ticket final : public StagedTicket {
 public:
  Ticket(std::shared_ptr<CudaStagedOrder> order, uint32_t number, EventPool::Event inputs, EventPool::Event done)
      : order_(std::move(order)), number_(number), inputs_(std::move(inputs)), done_(std::move(done)) {}
  ~Ticket() override { finish(); }

  c10::Stream copy_stream() const override { return order_->stream(order_->copy_stream_); }
  c10::Stream done_stream() const override { return order_->stream(order_->done_stream_); }

  void start() override {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(order_->device_));
    PYCOLL_CUDA_CHECK(cudaStreamWaitEvent(order_->copy_stream_, inputs_.get(), 0),
                      "pycoll: a staged op waiting for the caller's stream: cudaStreamWaitEvent");
    inputs_.reset();  // the wait took the event's state: back to the pool
  }

  void finish() noexcept override {
    if (finished_) return;
    finished_ = true;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(order_->device_));
    // Fails only where the context is gone (interpreter exit): nothing waits then.
    (void)order_->driver_.write(reinterpret_cast<CUstream>(order_->copy_stream_), order_->slot(number_), number_,
                                CU_STREAM_WRITE_VALUE_DEFAULT);
  }

  std::function<void()> wait_hook() const override {
    return [done = done_, device = order_->device_] {
      const auto current = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
      PYCOLL_CUDA_CHECK(cudaStreamWaitEvent(current.stream(), done.get(), 0),
                        "pycoll: Work.wait of a staged op: cudaStreamWaitEvent");
    };
  }

 private:
  std::shared_ptr<CudaStagedOrder> order_;
  uint32_t number_;
  EventPool::Event inputs_;
  EventPool::Event done_;
  bool finished_ = false;  // the executor thread alone calls finish() (or the last owner, after it)
};

std::shared_ptr<CudaStagedOrder> CudaStagedOrder::make(int device) {
  const Driver& driver = Driver::get();
  if (driver.wait == nullptr || driver.write == nullptr) return nullptr;
  std::shared_ptr<CudaStagedOrder> order(new CudaStagedOrder(device, driver));
  // The driver may refuse stream memory operations on this device: try one write and wait.
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const auto copy = reinterpret_cast<CUstream>(order->copy_stream_);
  if (driver.write(copy, order->slot(0), 0, CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS ||
      driver.wait(reinterpret_cast<CUstream>(order->done_stream_), order->slot(0), 0, CU_STREAM_WAIT_VALUE_GEQ) !=
          CUDA_SUCCESS ||
      cudaStreamSynchronize(order->done_stream_) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return order;
}

namespace {

// The two streams of a group's staged ops on one device. Never destroyed: the caching allocator
// records an event on a stream a freed tensor was used on, and the user's tensors outlive groups.
// A group that goes away gives its pair back for the next (every ticket finished by then, so no
// wait is left on them). Not shared between live groups: one group's copies queued behind another's
// wait could depend on each other.
struct StreamPair {
  cudaStream_t copy = nullptr;
  cudaStream_t done = nullptr;
};
struct FreePairs {
  std::mutex mu;
  std::map<int, std::vector<StreamPair>> by_device;
};
FreePairs& free_pairs() {
  static auto* pairs = new FreePairs();  // never destroyed: a group may go away during exit
  return *pairs;
}

StreamPair take_pair(int device) {
  {
    std::lock_guard<std::mutex> g(free_pairs().mu);
    auto& list = free_pairs().by_device[device];
    if (!list.empty()) {
      const StreamPair p = list.back();
      list.pop_back();
      return p;
    }
  }
  StreamPair p;
  PYCOLL_CUDA_CHECK(cudaStreamCreateWithFlags(&p.copy, cudaStreamNonBlocking), "pycoll: staged op stream");
  PYCOLL_CUDA_CHECK(cudaStreamCreateWithFlags(&p.done, cudaStreamNonBlocking), "pycoll: staged op stream");
  return p;
}

}  // namespace

CudaStagedOrder::CudaStagedOrder(int device, const Driver& driver) : device_(device), driver_(driver), events_(device) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  // Streams of their own: one that waits on a slot must hold up nothing else (pool streams are shared).
  const StreamPair pair = take_pair(device);
  copy_stream_ = pair.copy;
  done_stream_ = pair.done;
  slots_ = at::zeros({kSlots}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device));
  // Freed while a stream may still use it (a group torn down mid-op): the allocator waits for both.
  slots_.record_stream(stream(copy_stream_));
  slots_.record_stream(stream(done_stream_));
  PYCOLL_CUDA_CHECK(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(device).stream()),
                    "pycoll: staged op slots");  // zeroed before either stream reads them
}

CudaStagedOrder::~CudaStagedOrder() {
  std::lock_guard<std::mutex> g(free_pairs().mu);
  free_pairs().by_device[device_].push_back(StreamPair{copy_stream_, done_stream_});
}

c10::Stream CudaStagedOrder::stream(cudaStream_t s) const {
  return c10::cuda::getStreamFromExternal(s, static_cast<c10::DeviceIndex>(device_));
}

CUdeviceptr CudaStagedOrder::slot(uint32_t number) const {
  return reinterpret_cast<CUdeviceptr>(slots_.data_ptr<int32_t>() + number % kSlots);
}

std::shared_ptr<StagedTicket> CudaStagedOrder::issue(cudaStream_t caller) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  EventPool::Event inputs = events_.get();
  EventPool::Event done = events_.get();
  PYCOLL_CUDA_CHECK(cudaEventRecord(inputs.get(), caller), "pycoll: a staged op: cudaEventRecord");
  std::lock_guard<std::mutex> g(mu_);
  // Numbers start at 1 (the slots at 0); the wait compares as int32 differences, so they may wrap.
  const uint32_t number = ++issued_;
  const CUresult r =
      driver_.wait(reinterpret_cast<CUstream>(done_stream_), slot(number), number, CU_STREAM_WAIT_VALUE_GEQ);
  TORCH_CHECK(r == CUDA_SUCCESS, "pycoll: a staged op: cuStreamWaitValue32 failed (CUresult ", static_cast<int>(r),
              ")");
  PYCOLL_CUDA_CHECK(cudaEventRecord(done.get(), done_stream_), "pycoll: a staged op: cudaEventRecord");
  return std::make_shared<Ticket>(shared_from_this(), number, std::move(inputs), std::move(done));
}

}  // namespace pycoll

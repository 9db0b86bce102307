// Pooled pinned staging rings (see staging_ring.h).
#include "transfer/staging_ring.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <mutex>
#include <vector>

namespace speedtorch {
namespace {

struct Pool {
  std::mutex mutex;
  std::vector<std::unique_ptr<StagingRing>> idle;
};

Pool& pool() {
  static Pool* p = new Pool();  // leaked on purpose: rings hold CUDA events, which must not die after the driver
  return *p;
}

}  // namespace

StagingRing::StagingRing(int device, int64_t chunk_bytes)
    : device_(device),
      chunk_bytes_(chunk_bytes),
      buffer_(std::make_unique<PinnedHostBuffer>(static_cast<std::size_t>(chunk_bytes) * kChunks)) {
  TORCH_CHECK(buffer_->is_pinned(), "speedtorch: staging memory could not be page-locked");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  for (auto& e : events_) C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

StagingRing::~StagingRing() {
  // Chunks may still be the source or target of a copy: wait before the memory goes.
  for (auto e : events_) {
    if (cudaEventSynchronize(e) != cudaSuccess || cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
  }
  for (auto e : {start_, done_}) {
    if (cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
  }
}

BorrowedStagingRing::BorrowedStagingRing(int device, int64_t chunk_bytes) {
  {
    std::lock_guard<std::mutex> lock(pool().mutex);
    auto& idle = pool().idle;
    for (auto it = idle.begin(); it != idle.end(); ++it) {
      if ((*it)->device() == device && (*it)->chunk_bytes() == chunk_bytes) {
        ring_ = std::move(*it);
        idle.erase(it);
        return;
      }
    }
  }
  ring_ = std::make_unique<StagingRing>(device, chunk_bytes);
}

BorrowedStagingRing::~BorrowedStagingRing() {
  std::lock_guard<std::mutex> lock(pool().mutex);
  pool().idle.push_back(std::move(ring_));
}

}  // namespace speedtorch

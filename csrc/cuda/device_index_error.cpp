// Per-device out-of-range index records (see device_index_error.h).
#include "cuda/device_index_error.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

namespace speedtorch {
namespace {

constexpr int kMaxDevices = 64;

struct Records {
  std::mutex mutex;
  std::array<DeviceIndexError*, kMaxDevices> device{};  // device memory, written by kernels
  std::array<DeviceIndexError*, kMaxDevices> host{};    // pinned mirror read by the host
};

Records& records() {
  static Records* r = new Records();  // never destroyed: kernels may still reference it at exit
  return *r;
}

std::atomic<bool> g_deferred{false};

// Copies the record to the host (caller holds the mutex and has synchronised what must be seen), clears it, and
// throws if it was flagged.
void read_and_clear_locked(int device, cudaStream_t stream, const char* op, const char* arg) {
  Records& r = records();
  C10_CUDA_CHECK(cudaMemcpyAsync(r.host[device], r.device[device], sizeof(DeviceIndexError), cudaMemcpyDeviceToHost,
                                 stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  const DeviceIndexError seen = *r.host[device];
  if (seen.flag == 0) return;
  C10_CUDA_CHECK(cudaMemsetAsync(r.device[device], 0, sizeof(DeviceIndexError), stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  TORCH_CHECK_INDEX(false, op, ": ", arg, " holds ", seen.value, " at flat position ", seen.position,
                    "; every index must be in [0, ", seen.num_rows, ") for a table of ", seen.num_rows,
                    " rows (found by the GPU; the row was not touched)");
}

}  // namespace

DeviceIndexError* device_index_error_record(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "speedtorch: device index ", device, " out of range");
  Records& r = records();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.device[device] == nullptr) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    void* d = nullptr;
    void* h = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&d, sizeof(DeviceIndexError)));
    C10_CUDA_CHECK(cudaMemset(d, 0, sizeof(DeviceIndexError)));
    C10_CUDA_CHECK(cudaHostAlloc(&h, sizeof(DeviceIndexError), cudaHostAllocDefault));
    r.device[device] = static_cast<DeviceIndexError*>(d);
    r.host[device] = static_cast<DeviceIndexError*>(h);
  }
  return r.device[device];
}

void raise_if_device_index_error(int device, cudaStream_t stream, const char* op, const char* arg) {
  if (g_deferred.load()) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone) return;  // no synchronisation is allowed while capturing
  device_index_error_record(device);
  Records& r = records();
  std::lock_guard<std::mutex> lock(r.mutex);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  read_and_clear_locked(device, stream, op, arg);
}

void set_deferred_index_checks(bool deferred) { g_deferred.store(deferred); }
bool deferred_index_checks() { return g_deferred.load(); }

void check_deferred_index_errors() {
  Records& r = records();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (int device = 0; device < kMaxDevices; ++device) {
    if (r.device[device] == nullptr) continue;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    C10_CUDA_CHECK(cudaDeviceSynchronize());  // the record may be written from any stream
    read_and_clear_locked(device, nullptr, "speedtorch.check_index_errors", "indices");
  }
}

}  // namespace speedtorch

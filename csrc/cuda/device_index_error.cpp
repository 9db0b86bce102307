// Per-device out-of-range index records (see device_index_error.h).
#include "cuda/device_index_error.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "core/thread_scoped_values.h"

namespace speedtorch {
namespace {

constexpr int kMaxDevices = 64;

struct Records {
  std::mutex allocate_mutex;  // taken only to allocate a device's record
  std::mutex check_mutex;     // one reader-and-clearer at a time
  std::array<std::atomic<DeviceIndexError*>, kMaxDevices> device{};  // device memory, written by kernels
  std::array<DeviceIndexError*, kMaxDevices> host{};                 // pinned mirror read by the host
  std::mutex from_host_mutex;
  std::array<DeviceIndexError, kMaxDevices> from_host{};  // flag_index_error_from_host's, under from_host_mutex
};

Records& records() {
  static Records* r = new Records();  // never destroyed: kernels may still reference it at exit
  return *r;
}

std::atomic<bool> g_deferred{false};
thread_local ThreadScopedValues<bool> t_deferred;  // this thread's modes, oldest first

}  // namespace

DeviceIndexError* device_index_error_record(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "speedtorch: device index ", device, " out of range");
  Records& r = records();
  if (DeviceIndexError* record = r.device[device].load(std::memory_order_acquire)) return record;
  std::lock_guard<std::mutex> lock(r.allocate_mutex);
  if (DeviceIndexError* record = r.device[device].load(std::memory_order_acquire)) return record;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  // The first use may come while a stream is captured into a CUDA graph (an op's first call inside
  // torch.cuda.graph): allocating there is allowed only in relaxed mode, as PyTorch's allocator does.
  c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  void* d = nullptr;
  void* h = nullptr;
  C10_CUDA_CHECK(cudaMalloc(&d, sizeof(DeviceIndexError)));
  C10_CUDA_CHECK(cudaMemset(d, 0, sizeof(DeviceIndexError)));
  C10_CUDA_CHECK(cudaHostAlloc(&h, sizeof(DeviceIndexError), cudaHostAllocDefault));
  r.host[device] = static_cast<DeviceIndexError*>(h);
  r.device[device].store(static_cast<DeviceIndexError*>(d), std::memory_order_release);
  return r.device[device].load(std::memory_order_acquire);
}

void flag_index_error_from_host(int device, int64_t value, int64_t position, int64_t num_rows) noexcept {
  if (device < 0 || device >= kMaxDevices) return;
  Records& r = records();
  std::lock_guard<std::mutex> lock(r.from_host_mutex);
  if (r.from_host[device].flag == 0) r.from_host[device] = DeviceIndexError{1, kBadRowIndex, value, position, num_rows};
}

void set_deferred_index_checks(bool deferred) { g_deferred.store(deferred); }
bool deferred_index_checks() {
  if (!t_deferred.empty()) return t_deferred.entries().back().value;
  return g_deferred.load();
}

int64_t push_thread_deferred_index_checks(bool deferred) { return t_deferred.push(deferred); }

void pop_thread_deferred_index_checks(int64_t id, const char* who) {
  TORCH_CHECK(t_deferred.pop(id), who, ": this thread holds no index-check mode with id ", id,
              " (removed already, or set on another thread: a block's mode ends on the thread that began it)");
}

void check_deferred_index_errors() {
  Records& r = records();
  // Launches never wait for this lock (their records are read lock-free), so device-wide waits under it only
  // hold up other checkers.
  std::lock_guard<std::mutex> lock(r.check_mutex);
  for (int device = 0; device < kMaxDevices; ++device) {
    DeviceIndexError* record = r.device[device].load(std::memory_order_acquire);
    if (record == nullptr) continue;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    C10_CUDA_CHECK(cudaDeviceSynchronize());  // the record may be written from any stream
    C10_CUDA_CHECK(cudaMemcpy(r.host[device], record, sizeof(DeviceIndexError), cudaMemcpyDeviceToHost));
    DeviceIndexError seen = *r.host[device];
    {
      std::lock_guard<std::mutex> from_host(r.from_host_mutex);
      if (seen.flag == 0) seen = r.from_host[device];
      r.from_host[device] = DeviceIndexError{};  // what the kernels flagged is reported first; both are cleared
    }
    if (seen.flag == 0) continue;
    C10_CUDA_CHECK(cudaMemset(record, 0, sizeof(DeviceIndexError)));
    TORCH_CHECK_VALUE(seen.kind != kNegativeToken, "speedtorch.check_index_errors: tokens holds ", seen.value,
                      " at flat position ", seen.position, "; token ids must be >= 0 (found by the GPU on cuda:",
                      device, " in speedtorch.ngram_hash while checks were deferred; that position's row ids are -1)");
    TORCH_CHECK_VALUE(seen.kind != kBadBucketSize, "speedtorch.check_index_errors: bucket_sizes holds ", seen.value,
                      " in column ", seen.position, "; every bucket size must be >= 1 (found by the GPU on cuda:",
                      device, " in speedtorch.ngram_hash while checks were deferred; that column's row ids are -1)");
    TORCH_CHECK_VALUE(seen.kind != kUnsortedRows, "speedtorch.check_index_errors: an optimizer step was told its "
                      "indices are sorted and distinct (sorted_unique=True), but flat position ", seen.position,
                      " holds ", seen.value, ", not above the index before it (found by the GPU on cuda:", device,
                      " while index checks were deferred; that row was not updated, and rows repeated further apart "
                      "may have been updated twice at once: pass torch.unique(sorted=True)'s output, or "
                      "sorted_unique=False)");
    TORCH_CHECK_INDEX(false, "speedtorch.check_index_errors: indices holds ", seen.value, " at flat position ",
                      seen.position, "; every index must be in [0, ", seen.num_rows, ") for a table of ",
                      seen.num_rows, " rows (found by the GPU on cuda:", device, " while index checks were "
                      "deferred; the row was not touched)");
  }
}

}  // namespace speedtorch

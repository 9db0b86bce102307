// Shared pieces of the GPU routes (see device_access.h).
#include "transfer/device_access.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <map>

#include "cuda/device_index_error.h"
#include "cuda/index_summary_kernel.h"
#include "cuda/launch_shape.h"

namespace speedtorch {

int sm_count(int device) { return at::cuda::getDeviceProperties(device)->multiProcessorCount; }

int full_grid(int device) { return sm_count(device) * row_access::kBlocksPerSm; }

namespace {

// SMs the row kernels may occupy: the compute budget (max_sms), never more than the GPU has.
int64_t transfer_sms(int device, const TransferConfig& config) {
  const int64_t all = sm_count(device);
  return config.max_sms > 0 ? std::min<int64_t>(config.max_sms, all) : all;
}

}  // namespace

RowLaunch uva_launch(int device, const TransferConfig& config) {
  return RowLaunch{static_cast<int>(transfer_sms(device, config) * config.uva_blocks_per_sm),
                   static_cast<int>(config.uva_rows_in_flight)};
}

RowLaunch device_table_launch(int device, const TransferConfig& config) {
  return RowLaunch{static_cast<int>(transfer_sms(device, config) * row_access::kBlocksPerSm), 1};
}

bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

char* mapped_address(const at::Tensor& host, const char* op, const char* arg) {
  char* data = static_cast<char*>(host.data_ptr());
  void* allocation = const_cast<void*>(host.storage().data());
  void* device = nullptr;
  const cudaError_t err = cudaHostGetDevicePointer(&device, allocation, 0);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_CHECK(false, op, ": ", arg, " is not mapped into the GPU's address space (", cudaGetErrorString(err),
                "); allocate it with speedtorch.pinned_empty / speedtorch.PinnedEmbedding or Tensor.pin_memory()");
  }
  return static_cast<char*>(device) + (data - static_cast<char*>(allocation));
}

void note_uva_use(const at::Tensor& host, UvaAccess access, const c10::cuda::CUDAStream& stream) {
  if (stream_is_capturing(stream.stream())) return;
  const void* allocation = host.storage().data();
  note_uva_access(allocation, access, stream.device_index(), stream.stream());
  // A no-op (false) for memory PyTorch's allocator does not own, such as speedtorch's pinned buffers.
  (void)at::getHostAllocator(at::kCUDA)->record_event(const_cast<void*>(allocation),
                                                       host.storage().data_ptr().get_context(), stream.unwrap());
}

at::Tensor indices_on(const at::Tensor& indices, const at::Device& device) {
  if (indices.device() == device) return indices;
  // Another GPU's indices: a device-to-device copy, which torch orders after the producing GPU's current stream and
  // before `device`'s (pin_memory() only takes host tensors).
  if (!indices.is_cpu()) return indices.to(device);
  // Host indices go through a pinned copy of our own, made now, even when the caller's tensor is pinned already:
  // the asynchronous copy reads it after this call returns, when the caller may have changed its tensor, and the
  // op checked the values it saw.
  return private_pinned_copy(indices).to(device, /*non_blocking=*/true);
}

at::Tensor private_pinned_copy(const at::Tensor& host_indices) {
  at::Tensor staged = at::empty(host_indices.sizes(), host_indices.options().pinned_memory(true));
  staged.copy_(host_indices);
  return staged;
}

namespace {

// This thread's buffers for index summaries on each device: the device record the summary kernel folds into
// (reset by the kernel itself) and the mapped host memory it writes the result to, read here after the wait. One
// thread's summaries never overlap (each is waited for before the call returns), so one pair a device is enough.
class SummaryBuffers {
 public:
  struct Pair {
    IndexSummaryScratch* scratch = nullptr;
    IndexSummary* host = nullptr;
    IndexSummary* mapped = nullptr;
  };
  ~SummaryBuffers() {
    for (auto& [device, pair] : pairs_) {  // at thread exit: nothing to report to
      (void)cudaFree(pair.scratch);
      (void)cudaFreeHost(pair.host);
    }
  }
  const Pair& get(int device) {
    auto found = pairs_.find(device);
    if (found != pairs_.end()) return found->second;
    Pair pair;
    void* host = nullptr;
    C10_CUDA_CHECK(cudaHostAlloc(&host, sizeof(IndexSummary), cudaHostAllocMapped | cudaHostAllocPortable));
    pair.host = static_cast<IndexSummary*>(host);
    void* mapped = nullptr;
    C10_CUDA_CHECK(cudaHostGetDevicePointer(&mapped, host, 0));
    pair.mapped = static_cast<IndexSummary*>(mapped);
    void* scratch = nullptr;
    C10_CUDA_CHECK(cudaMalloc(&scratch, sizeof(IndexSummaryScratch)));
    pair.scratch = static_cast<IndexSummaryScratch*>(scratch);
    const IndexSummaryScratch identity = index_summary_scratch_identity();
    C10_CUDA_CHECK(cudaMemcpy(scratch, &identity, sizeof(identity), cudaMemcpyHostToDevice));
    return pairs_[device] = pair;
  }

 private:
  std::map<int, Pair> pairs_;
};

}  // namespace

IndexSummary summarize_cuda_indices(const at::Tensor& flat) {
  TORCH_INTERNAL_ASSERT(flat.is_cuda() && flat.dim() == 1 && flat.is_contiguous() && flat.numel() > 0);
  thread_local SummaryBuffers buffers;
  const int device = flat.get_device();
  c10::cuda::CUDAGuard guard(flat.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  const SummaryBuffers::Pair& pair = buffers.get(device);
  launch_index_summary(GpuIndices{flat.const_data_ptr(), flat.scalar_type() == at::kLong, flat.numel()},
                       pair.scratch, pair.mapped, stream.stream());
  stream.synchronize();
  return *pair.host;
}

std::optional<IndexSpan> validate_indices(const at::Tensor& indices, int64_t num_rows, cudaStream_t stream,
                                          const char* op, bool* sorted) {
  if (sorted != nullptr) *sorted = false;
  if (indices.numel() == 0) return IndexSpan{};
  const bool capturing = stream_is_capturing(stream);
  if (indices.is_cpu()) {
    TORCH_CHECK(!capturing, op, ": indices on the CPU cannot be captured into a CUDA graph (each replay would copy "
                "them again from a temporary host buffer); capture with indices on the GPU, in a tensor you refill "
                "before each replay");
    return check_index_tensor(indices.contiguous(), num_rows, op);
  }
  if (deferred_index_checks() || capturing) return std::nullopt;
  const at::Tensor flat = indices.reshape({-1}).contiguous();
  const IndexSummary summary = summarize_cuda_indices(flat);
  if (summary.min < 0 || summary.max >= num_rows) check_index_tensor(flat.cpu(), num_rows, op);  // throws
  if (sorted != nullptr) *sorted = summary.first_descent < 0;
  return IndexSpan{summary.min, summary.max};
}

int64_t touched_bytes(int64_t num_rows, int64_t row_stride_bytes, const std::optional<IndexSpan>& span) {
  if (!span.has_value() || span->max < span->min) return num_rows * row_stride_bytes;
  return (span->max - span->min + 1) * row_stride_bytes;
}

}  // namespace speedtorch

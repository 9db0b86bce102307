// Shared pieces of the GPU routes (see device_access.h).
#include "transfer/device_access.h"

#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

#include "cuda/device_index_error.h"
#include "cuda/launch_shape.h"

namespace speedtorch {

int sm_count(int device) { return at::cuda::getDeviceProperties(device)->multiProcessorCount; }

int full_grid(int device) { return sm_count(device) * row_access::kBlocksPerSm; }

int uva_max_blocks(int device, const TransferConfig& config) {
  return static_cast<int>(sm_count(device) * config.uva_blocks_per_sm);
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
  const at::Tensor pinned = indices.is_pinned() ? indices : indices.pin_memory();
  return pinned.to(device, /*non_blocking=*/true);
}

std::optional<IndexSpan> validate_indices(const at::Tensor& indices, int64_t num_rows, cudaStream_t stream,
                                          const char* op) {
  if (indices.numel() == 0) return IndexSpan{};
  const bool capturing = stream_is_capturing(stream);
  if (indices.is_cpu()) {
    TORCH_CHECK(!capturing, op, ": indices on the CPU cannot be captured into a CUDA graph (each replay would copy "
                "them again from a temporary host buffer); capture with indices on the GPU, in a tensor you refill "
                "before each replay");
    return check_index_tensor(indices.contiguous(), num_rows, op);
  }
  if (deferred_index_checks() || capturing) return std::nullopt;
  return check_index_tensor_on_any_device(indices, num_rows, op);
}

int64_t touched_bytes(int64_t num_rows, int64_t row_stride_bytes, const std::optional<IndexSpan>& span) {
  if (!span.has_value() || span->max < span->min) return num_rows * row_stride_bytes;
  return (span->max - span->min + 1) * row_stride_bytes;
}

}  // namespace speedtorch

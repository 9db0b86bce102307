// The CUDA route of speedtorch::ngram_hash (see ngram_hash.h).
#include <ATen/ops/min.h>
#include <ATen/ops/stack.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "cuda/device_index_error.h"
#include "cuda/ngram_hash_kernel.h"
#include "engram/ngram_hash.h"
#include "transfer/device_access.h"

namespace speedtorch {
namespace {

// The first flat position of `values` (int64 or int32, on the host) below `low`, or -1.
int64_t first_below(const at::Tensor& values, int64_t low) {
  const at::Tensor host = values.cpu().reshape({-1}).to(at::kLong).contiguous();
  const int64_t* p = host.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (p[i] < low) return i;
  }
  return -1;
}

// Raises for a negative token or a bucket size < 1, naming the first: one reduction each, read back together
// (a wait for `stream` only); the values come to the host only when one is bad.
void check_values_on_gpu(const at::Tensor& tokens, const at::Tensor& bucket_sizes, const char* op) {
  const at::Tensor lows = at::stack({at::min(tokens).to(at::kLong), at::min(bucket_sizes)}).cpu();
  if (lows[0].item<int64_t>() < 0) {
    const int64_t position = first_below(tokens, 0);
    TORCH_CHECK_VALUE(false, op, ": tokens holds ", tokens.reshape({-1})[position].item<int64_t>(),
                      " at flat position ", position, "; token ids must be >= 0");
  }
  if (lows[1].item<int64_t>() < 1) {
    const int64_t position = first_below(bucket_sizes, 1);
    TORCH_CHECK_VALUE(false, op, ": bucket_sizes holds ", bucket_sizes.reshape({-1})[position].item<int64_t>(),
                      " at flat position ", position, "; every (order, head) column needs at least one row");
  }
}

}  // namespace

void ngram_hash_cuda(const at::Tensor& tokens, const at::Tensor& multipliers, const at::Tensor& bucket_sizes,
                     int64_t pad_id, const at::Tensor& document_starts, at::Tensor& out, const char* op) {
  const int device = tokens.get_device();
  c10::cuda::CUDAGuard guard(tokens.device());
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
  if (tokens.numel() > 0 && !deferred_index_checks() && !stream_is_capturing(stream.stream())) {
    check_values_on_gpu(tokens, bucket_sizes, op);
  }
  const NgramHashShape shape{multipliers.size(0), static_cast<int>(multipliers.size(1)), pad_id};
  launch_ngram_hash(tokens.const_data_ptr(), tokens.scalar_type() == at::kLong,
                    document_starts.defined() ? document_starts.const_data_ptr<bool>() : nullptr, tokens.size(0),
                    tokens.size(1), shape, reinterpret_cast<const uint64_t*>(multipliers.const_data_ptr<int64_t>()),
                    bucket_sizes.const_data_ptr<int64_t>(), out.data_ptr<int64_t>(),
                    device_index_error_record(device), stream.stream());
}

}  // namespace speedtorch

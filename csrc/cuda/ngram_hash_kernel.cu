// GPU n-gram hash: one thread per (position, head) computes that head's row id for every order
// (core/ngram_hash_math.h, the same code the CPU loop runs). Each block first copies the multipliers and bucket
// sizes into shared memory and forms the columns' offsets (their prefix sum), so the table layout needs no host
// round trip and the kernel can be captured into a CUDA graph.
#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "cuda/launch_shape.h"
#include "cuda/ngram_hash_kernel.h"

namespace speedtorch {
namespace {

using row_access::kThreadsPerBlock;

// Heads x orders multipliers fit: columns = (orders - 1) x heads <= kMaxNgramColumns and orders >= 2.
constexpr int kMaxMultipliers = 2 * kMaxNgramColumns;

__device__ void flag_error(DeviceIndexError* error, DeviceErrorKind kind, int64_t value, int64_t position) {
  if (atomicCAS(&error->flag, 0, 1) == 0) {
    error->kind = kind;
    error->value = value;
    error->position = position;
    error->num_rows = 0;
  }
}

template <typename Token>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ngram_hash_kernel(const Token* __restrict__ tokens, const bool* __restrict__ starts, int64_t batch, int64_t seq,
                      NgramHashShape shape, const uint64_t* __restrict__ multipliers,
                      const int64_t* __restrict__ bucket_sizes, int64_t* __restrict__ out, DeviceIndexError* error) {
  __shared__ uint64_t mult[kMaxMultipliers];
  __shared__ int64_t sizes[kMaxNgramColumns];
  __shared__ int64_t offsets[kMaxNgramColumns];
  __shared__ bool bad_size[kMaxNgramColumns];
  const int64_t columns = (shape.max_order - 1) * shape.heads;
  for (int64_t i = threadIdx.x; i < shape.heads * shape.max_order; i += blockDim.x) mult[i] = multipliers[i];
  for (int64_t c = threadIdx.x; c < columns; c += blockDim.x) {
    const int64_t size = bucket_sizes[c];
    bad_size[c] = size < 1;
    sizes[c] = size < 1 ? 1 : size;  // never a division by zero; the column's ids are -1 anyway
    if (size < 1 && blockIdx.x == 0) flag_error(error, kBadBucketSize, size, c);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t first = 0;
    for (int64_t c = 0; c < columns; ++c) {
      offsets[c] = first;
      first += sizes[c];
    }
  }
  __syncthreads();

  const int64_t work = batch * seq * shape.heads;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint64_t values[kMaxNgramOrder];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < work; i += stride) {
    const int64_t p = i / shape.heads;  // the position
    const int64_t h = i - p * shape.heads;
    const int64_t b = p / seq;
    const int64_t t = p - b * seq;
    const Token* row = tokens + b * seq;
    int64_t* dst = out + p * columns;
    if (row[t] < 0) {  // flagged by head 0 only, once per position; the position's ids are -1
      if (h == 0) flag_error(error, kNegativeToken, static_cast<int64_t>(row[t]), p);
      for (int n = 2; n <= shape.max_order; ++n) dst[(n - 2) * shape.heads + h] = -1;
      continue;
    }
    ngram_lookback(row, starts != nullptr ? starts + b * seq : nullptr, t, shape.max_order, shape.pad_id, values);
    ngram_head_rows(shape, values, h, mult, sizes, offsets, dst);
    for (int n = 2; n <= shape.max_order; ++n) {
      if (bad_size[(n - 2) * shape.heads + h]) dst[(n - 2) * shape.heads + h] = -1;
    }
  }
}

}  // namespace

void launch_ngram_hash(const void* tokens, bool tokens_int64, const bool* starts, int64_t batch, int64_t seq,
                       const NgramHashShape& shape, const uint64_t* multipliers, const int64_t* bucket_sizes,
                       int64_t* out, DeviceIndexError* error, cudaStream_t stream) {
  const int64_t work = batch * seq * shape.heads;
  if (work == 0) return;
  // A thread per (position, head), capped: the grid strides over the rest, and every block recomputes the offsets.
  const int64_t blocks = std::min<int64_t>((work + kThreadsPerBlock - 1) / kThreadsPerBlock, 4096);
  if (tokens_int64) {
    ngram_hash_kernel<int64_t><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
        static_cast<const int64_t*>(tokens), starts, batch, seq, shape, multipliers, bucket_sizes, out, error);
  } else {
    ngram_hash_kernel<int32_t><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
        static_cast<const int32_t*>(tokens), starts, batch, seq, shape, multipliers, bucket_sizes, out, error);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace speedtorch

// What the host must know of a batch of CUDA indices before it moves a row: their smallest and largest value (the
// range check, and the span of table the batch touches) and whether they are sorted (then the UVA share needs no
// locality sort) or strictly increasing (sorted_unique's claim), with the first position breaking each.
//
// One launch: each block reduces its part, folds it into a small device record with atomics, and the last block to
// finish writes the summary straight into host memory (which the caller reads after a wait) and resets the record
// for the next call. A reduction, a stack, a copy and their launches cost ~4x more on the GPU machine's host
// (issue 23's profile, bench/RESULTS.md).
#include <c10/cuda/CUDAException.h>

#include <climits>

#include "cuda/index_summary_kernel.h"

namespace speedtorch {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxBlocks = 64;
constexpr int64_t kIndicesPerBlock = 8 * kThreads;

static_assert(kWarps == 32, "a block's warps are folded by one thread");

// The value of *p, replaced by `identity` (atomicExch has no signed 64-bit form).
__device__ long long take(long long* p, long long identity) {
  return static_cast<long long>(atomicExch(reinterpret_cast<unsigned long long*>(p),
                                           static_cast<unsigned long long>(identity)));
}

__device__ int64_t warp_min(int64_t v) {
  for (int o = 16; o > 0; o /= 2) v = min(v, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, v, o)));
  return v;
}

__device__ int64_t warp_max(int64_t v) {
  for (int o = 16; o > 0; o /= 2) v = max(v, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, v, o)));
  return v;
}

template <typename Index>
__global__ void __launch_bounds__(kThreads)
    index_summary_kernel(const Index* __restrict__ indices, int64_t count, IndexSummaryScratch* scratch,
                         IndexSummary* out) {
  int64_t lo = LLONG_MAX;
  int64_t hi = LLONG_MIN;
  int64_t first_descent = LLONG_MAX;
  int64_t first_not_increasing = LLONG_MAX;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count; i += stride) {
    const int64_t v = static_cast<int64_t>(indices[i]);
    lo = min(lo, v);
    hi = max(hi, v);
    if (i > 0) {
      const int64_t before = static_cast<int64_t>(indices[i - 1]);
      if (v < before) first_descent = min(first_descent, i);
      if (v <= before) first_not_increasing = min(first_not_increasing, i);
    }
  }
  __shared__ int64_t partial[4][kWarps];
  __shared__ bool last;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  lo = warp_min(lo);
  hi = warp_max(hi);
  first_descent = warp_min(first_descent);
  first_not_increasing = warp_min(first_not_increasing);
  if (lane == 0) {
    partial[0][warp] = lo;
    partial[1][warp] = hi;
    partial[2][warp] = first_descent;
    partial[3][warp] = first_not_increasing;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t block[4] = {LLONG_MAX, LLONG_MIN, LLONG_MAX, LLONG_MAX};
    for (int w = 0; w < kWarps; ++w) {
      block[0] = min(block[0], partial[0][w]);
      block[1] = max(block[1], partial[1][w]);
      block[2] = min(block[2], partial[2][w]);
      block[3] = min(block[3], partial[3][w]);
    }
    atomicMin(&scratch->min, static_cast<long long>(block[0]));
    atomicMax(&scratch->max, static_cast<long long>(block[1]));
    atomicMin(&scratch->first_descent, static_cast<long long>(block[2]));
    atomicMin(&scratch->first_not_increasing, static_cast<long long>(block[3]));
    __threadfence();  // this block's folds are visible before its ticket
    last = atomicAdd(&scratch->blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();  // every other block's folds, seen through their tickets
    const long long a = take(&scratch->min, LLONG_MAX);
    const long long b = take(&scratch->max, LLONG_MIN);
    const long long c = take(&scratch->first_descent, LLONG_MAX);
    const long long d = take(&scratch->first_not_increasing, LLONG_MAX);
    scratch->blocks_done = 0;
    out->min = a;
    out->max = b;
    out->first_descent = c == LLONG_MAX ? -1 : c;
    out->first_not_increasing = d == LLONG_MAX ? -1 : d;
  }
}

}  // namespace

IndexSummaryScratch index_summary_scratch_identity() {
  return IndexSummaryScratch{LLONG_MAX, LLONG_MIN, LLONG_MAX, LLONG_MAX, 0u, 0u};
}

void launch_index_summary(const GpuIndices& indices, IndexSummaryScratch* scratch, IndexSummary* out,
                          cudaStream_t stream) {
  const int64_t wanted = (indices.count + kIndicesPerBlock - 1) / kIndicesPerBlock;
  const unsigned blocks = static_cast<unsigned>(wanted < 1 ? 1 : (wanted > kMaxBlocks ? kMaxBlocks : wanted));
  if (indices.is_int64) {
    index_summary_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const int64_t*>(indices.data), indices.count,
                                                          scratch, out);
  } else {
    index_summary_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const int32_t*>(indices.data), indices.count,
                                                          scratch, out);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace speedtorch

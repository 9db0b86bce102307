// Orders the UVA share of a transfer by table row, so that warps running together touch nearby host pages.
//
// Over a table larger than the GPU translates quickly, random rows cost a page-table walk each; sorted, the warps
// in flight share translations and the UVA rate roughly doubles (bench/RESULTS.md). The radix sort skips the bits
// below a bucket of the table (TransferConfig::uva_sort_bucket_bytes): fewer passes.
#include <c10/cuda/CUDAException.h>
#include <cub/device/device_radix_sort.cuh>

#include "cuda/row_kernels.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

int bit_length(uint64_t v) {
  int bits = 0;
  while (v != 0) {
    ++bits;
    v >>= 1;
  }
  return bits;
}

__global__ void iota_kernel(int64_t* out, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) out[i] = i;
}

template <typename Index>
size_t sort_temp_bytes(int64_t count, int begin_bit, int end_bit) {
  size_t bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const Index*>(nullptr),
                                                 static_cast<Index*>(nullptr), static_cast<const int64_t*>(nullptr),
                                                 static_cast<int64_t*>(nullptr), count, begin_bit, end_bit));
  return bytes;
}

}  // namespace

LocalitySortPlan plan_locality_sort(const GpuIndices& indices, int64_t num_rows, int64_t row_stride_bytes,
                                    int64_t bucket_bytes) {
  LocalitySortPlan plan;
  plan.end_bit = bit_length(static_cast<uint64_t>(num_rows > 1 ? num_rows - 1 : 1));
  const int64_t rows_per_bucket = row_stride_bytes > 0 ? bucket_bytes / row_stride_bytes : 1;
  plan.begin_bit = rows_per_bucket > 1 ? bit_length(static_cast<uint64_t>(rows_per_bucket)) - 1 : 0;
  if (plan.begin_bit >= plan.end_bit) plan.begin_bit = 0;
  plan.temp_bytes = indices.is_int64 ? sort_temp_bytes<int64_t>(indices.count, plan.begin_bit, plan.end_bit)
                                     : sort_temp_bytes<int32_t>(indices.count, plan.begin_bit, plan.end_bit);
  return plan;
}

void launch_locality_sort(const GpuIndices& indices, const LocalitySortPlan& plan, void* temp, void* sorted_out,
                          int64_t* positions_out, int64_t* iota_scratch, int max_blocks, cudaStream_t stream) {
  if (indices.count == 0) return;
  iota_kernel<<<row_access::grid_for(indices.count, 1, max_blocks), row_access::kThreadsPerBlock, 0, stream>>>(
      iota_scratch, indices.count);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  size_t temp_bytes = plan.temp_bytes;
  if (indices.is_int64) {
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, static_cast<const int64_t*>(indices.data),
                                                   static_cast<int64_t*>(sorted_out), iota_scratch, positions_out,
                                                   indices.count, plan.begin_bit, plan.end_bit, stream));
  } else {
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, static_cast<const int32_t*>(indices.data),
                                                   static_cast<int32_t*>(sorted_out), iota_scratch, positions_out,
                                                   indices.count, plan.begin_bit, plan.end_bit, stream));
  }
}

}  // namespace speedtorch

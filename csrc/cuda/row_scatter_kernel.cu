// GPU row scatter: table[indices[i]] = src[i], the table in device memory or in mapped pinned host memory (UVA).
//
// Rows are written whole by one group of lanes. Duplicate indices are resolved before the launch (a keep mask from
// last_occurrence_kernel.cu), so no two groups ever write the same row and a row is never a mix of two sources.
#include <c10/cuda/CUDAException.h>

#include "cuda/row_kernels.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

using namespace row_access;

template <typename V, typename Index>
__global__ void __launch_bounds__(kThreadsPerBlock)
    row_scatter_kernel(char* __restrict__ table, int64_t num_rows, int64_t row_stride, int64_t vectors_per_row,
                       int lanes, const Index* __restrict__ indices, const int64_t* __restrict__ positions, int64_t count, const V* __restrict__ src,
                       const uint8_t* __restrict__ keep, const int32_t* abort, DeviceIndexError* error) {
  if (abort != nullptr && *abort != 0) return;  // a bad index was seen: all rows or none
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride_rows = static_cast<int64_t>(gridDim.x) * blockDim.x / lanes;
  const int lane = static_cast<int>(thread % lanes);
  for (int64_t i = thread / lanes; i < count; i += stride_rows) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    const int64_t position = positions != nullptr ? positions[i] : i;
    if (row < 0 || row >= num_rows) {
      if (lane == 0 && atomicCAS(&error->flag, 0, 1) == 0) {
        error->value = row;
        error->position = position;
        error->num_rows = num_rows;
      }
      continue;
    }
    if (keep != nullptr && keep[position] == 0) continue;
    V* dst = reinterpret_cast<V*>(table + row * row_stride);
    const V* from = src + position * vectors_per_row;
    for (int64_t v = lane; v < vectors_per_row; v += lanes) dst[v] = from[v];
  }
}

template <int Bytes, typename Index>
void launch(const GpuRows& t, const Index* idx, const int64_t* positions, int64_t count, const char* src, const uint8_t* keep,
            const int32_t* abort, DeviceIndexError* error, int max_blocks, cudaStream_t stream) {
  using V = typename Vector<Bytes>::type;
  const int64_t vectors = t.row_bytes / Bytes;
  const int lanes = lanes_per_row(vectors);
  row_scatter_kernel<V, Index><<<grid_for(count, lanes, max_blocks), kThreadsPerBlock, 0, stream>>>(
      t.base, t.num_rows, t.row_stride_bytes, vectors, lanes, idx, positions, count, reinterpret_cast<const V*>(src), keep,
      abort, error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename Index>
void launch_for_index(const GpuRows& t, const Index* idx, const int64_t* positions, int64_t count, const char* src, const uint8_t* keep,
                      const int32_t* abort, DeviceIndexError* error, int max_blocks, cudaStream_t stream) {
  const int width = widest_access_bytes({static_cast<uint64_t>(t.row_bytes), static_cast<uint64_t>(t.row_stride_bytes),
                                         reinterpret_cast<uint64_t>(t.base), reinterpret_cast<uint64_t>(src)});
  switch (width) {
    case 16: return launch<16>(t, idx, positions, count, src, keep, abort, error, max_blocks, stream);
    case 8: return launch<8>(t, idx, positions, count, src, keep, abort, error, max_blocks, stream);
    case 4: return launch<4>(t, idx, positions, count, src, keep, abort, error, max_blocks, stream);
    case 2: return launch<2>(t, idx, positions, count, src, keep, abort, error, max_blocks, stream);
    default: return launch<1>(t, idx, positions, count, src, keep, abort, error, max_blocks, stream);
  }
}

}  // namespace

void launch_row_scatter(const GpuRows& table, const GpuIndices& indices, const char* src, const uint8_t* keep,
                        const int32_t* abort, DeviceIndexError* error, int max_blocks, cudaStream_t stream) {
  if (indices.count == 0 || table.row_bytes == 0) return;
  if (indices.is_int64) {
    launch_for_index(table, static_cast<const int64_t*>(indices.data), indices.positions, indices.count, src, keep, abort, error, max_blocks,
                     stream);
  } else {
    launch_for_index(table, static_cast<const int32_t*>(indices.data), indices.positions, indices.count, src, keep, abort, error, max_blocks,
                     stream);
  }
}

}  // namespace speedtorch

// GPU row scatter: table[indices[i]] = src[i], the table in device memory or in mapped pinned host memory (UVA).
//
// Rows are written whole by one group of lanes. Duplicate indices are resolved before the launch (a keep mask from
// last_occurrence_kernel.cu), so no two groups ever write the same row and a row is never a mix of two sources.
// As in the gather, each group loads `Rows` entries' source rows before it stores any, and the stores to the table
// are streaming stores (row_vector_access.cuh): 0.62 -> 0.92 of memcpy for the yardstick's scatter.
#include <c10/cuda/CUDAException.h>

#include "cuda/row_kernels.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

using namespace row_access;

template <typename V, typename Index, int Rows>
__global__ void __launch_bounds__(kThreadsPerBlock)
    row_scatter_kernel(char* __restrict__ table, int64_t num_rows, int64_t row_stride, int64_t vectors_per_row,
                       int lanes, const Index* __restrict__ indices, const int64_t* __restrict__ positions,
                       int64_t count, const V* __restrict__ src, const uint8_t* __restrict__ keep,
                       const int32_t* abort, DeviceIndexError* error) {
  if (abort != nullptr && *abort != 0) return;  // a bad index was seen: all rows or none
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / lanes;
  const int lane = static_cast<int>(thread % lanes);
  for (int64_t first = thread / lanes * Rows; first < count; first += groups * Rows) {
    const V* from[Rows];
    V* dst[Rows];
#pragma unroll
    for (int u = 0; u < Rows; ++u) {
      const int64_t i = first + u;
      from[u] = nullptr;
      dst[u] = nullptr;
      if (i >= count) continue;
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
      dst[u] = reinterpret_cast<V*>(table + row * row_stride);
      from[u] = src + position * vectors_per_row;
    }
    for (int64_t v = lane; v < vectors_per_row; v += lanes) {
      V values[Rows];
#pragma unroll
      for (int u = 0; u < Rows; ++u) {
        if (from[u] != nullptr) values[u] = load_streaming(from[u] + v);
      }
#pragma unroll
      for (int u = 0; u < Rows; ++u) {
        if (dst[u] != nullptr) store_streaming(dst[u] + v, values[u]);
      }
    }
  }
}

template <int Bytes, typename Index, int Rows>
void launch(const GpuRows& t, const Index* idx, const int64_t* positions, int64_t count, const char* src,
            const uint8_t* keep, const int32_t* abort, DeviceIndexError* error, int max_blocks, cudaStream_t stream) {
  using V = typename Vector<Bytes>::type;
  const int64_t vectors = t.row_bytes / Bytes;
  const int lanes = lanes_per_row(vectors);
  row_scatter_kernel<V, Index, Rows><<<grid_for((count + Rows - 1) / Rows, lanes, max_blocks), kThreadsPerBlock, 0,
                                       stream>>>(t.base, t.num_rows, t.row_stride_bytes, vectors, lanes, idx,
                                                 positions, count, reinterpret_cast<const V*>(src), keep, abort,
                                                 error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Rows in flight as a template argument, as in row_gather_kernel.cu.
template <int Bytes, typename Index>
void launch_rows(const GpuRows& t, const Index* idx, const int64_t* positions, int64_t count, const char* src,
                 const uint8_t* keep, const int32_t* abort, DeviceIndexError* error, const RowLaunch& l,
                 cudaStream_t stream) {
  if constexpr (Bytes >= 8) {
    switch (rows_in_flight_for(count, lanes_per_row(t.row_bytes / Bytes), l.max_blocks, l.rows_in_flight)) {
      case 1: return launch<Bytes, Index, 1>(t, idx, positions, count, src, keep, abort, error, l.max_blocks, stream);
      case 2: return launch<Bytes, Index, 2>(t, idx, positions, count, src, keep, abort, error, l.max_blocks, stream);
      case 8: return launch<Bytes, Index, 8>(t, idx, positions, count, src, keep, abort, error, l.max_blocks, stream);
      default: break;
    }
  }
  launch<Bytes, Index, 4>(t, idx, positions, count, src, keep, abort, error, l.max_blocks, stream);
}

template <typename Index>
void launch_for_index(const GpuRows& t, const Index* idx, const int64_t* positions, int64_t count, const char* src,
                      const uint8_t* keep, const int32_t* abort, DeviceIndexError* error, const RowLaunch& l,
                      cudaStream_t stream) {
  const int width = widest_access_bytes({static_cast<uint64_t>(t.row_bytes), static_cast<uint64_t>(t.row_stride_bytes),
                                         reinterpret_cast<uint64_t>(t.base), reinterpret_cast<uint64_t>(src)});
  switch (width) {
    case 16: return launch_rows<16>(t, idx, positions, count, src, keep, abort, error, l, stream);
    case 8: return launch_rows<8>(t, idx, positions, count, src, keep, abort, error, l, stream);
    case 4: return launch_rows<4>(t, idx, positions, count, src, keep, abort, error, l, stream);
    case 2: return launch_rows<2>(t, idx, positions, count, src, keep, abort, error, l, stream);
    default: return launch_rows<1>(t, idx, positions, count, src, keep, abort, error, l, stream);
  }
}

}  // namespace

void launch_row_scatter(const GpuRows& table, const GpuIndices& indices, const char* src, const uint8_t* keep,
                        const int32_t* abort, DeviceIndexError* error, const RowLaunch& launch, cudaStream_t stream) {
  if (indices.count == 0 || table.row_bytes == 0) return;
  if (indices.is_int64) {
    launch_for_index(table, static_cast<const int64_t*>(indices.data), indices.positions, indices.count, src, keep,
                     abort, error, launch, stream);
  } else {
    launch_for_index(table, static_cast<const int32_t*>(indices.data), indices.positions, indices.count, src, keep,
                     abort, error, launch, stream);
  }
}

}  // namespace speedtorch

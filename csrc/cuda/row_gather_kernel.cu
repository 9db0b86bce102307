// GPU row gather: out[i] = table[indices[i]], the table in device memory or in mapped pinned host memory (UVA).
//
// Each row is read by a group of lanes with the widest aligned access, so a 512-byte row is one 16-byte load per
// lane of a warp. Over UVA every load crosses PCIe and waits ~1-2 us for its answer, so the rate is set by the
// bytes in flight: each group issues the loads of `Rows` consecutive entries (neighbours in a sorted batch, so on
// nearby host pages) before it stores any, and table rows are read with streaming loads (row_vector_access.cuh).
#include <c10/cuda/CUDAException.h>

#include "cuda/row_kernels.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

using namespace row_access;

template <typename V, typename Index, int Rows>
__global__ void __launch_bounds__(kThreadsPerBlock)
    row_gather_kernel(const char* __restrict__ table, int64_t num_rows, int64_t row_stride, int64_t vectors_per_row,
                      int lanes, const Index* __restrict__ indices, const int64_t* __restrict__ positions,
                      int64_t count, V* __restrict__ out, DeviceIndexError* error) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / lanes;
  const int lane = static_cast<int>(thread % lanes);
  for (int64_t first = thread / lanes * Rows; first < count; first += groups * Rows) {
    const V* src[Rows];
    V* dst[Rows];
#pragma unroll
    for (int u = 0; u < Rows; ++u) {
      const int64_t i = first + u;
      src[u] = nullptr;
      dst[u] = nullptr;
      if (i >= count) continue;
      const int64_t row = static_cast<int64_t>(indices[i]);
      const int64_t position = positions != nullptr ? positions[i] : i;
      dst[u] = out + position * vectors_per_row;
      if (row >= 0 && row < num_rows) {
        src[u] = reinterpret_cast<const V*>(table + row * row_stride);
      } else if (lane == 0 && atomicCAS(&error->flag, 0, 1) == 0) {
        error->value = row;
        error->position = position;
        error->num_rows = num_rows;
      }
    }
    for (int64_t v = lane; v < vectors_per_row; v += lanes) {
      V values[Rows];
#pragma unroll
      for (int u = 0; u < Rows; ++u) values[u] = src[u] != nullptr ? load_streaming(src[u] + v) : all_ones<V>();
#pragma unroll
      for (int u = 0; u < Rows; ++u) {
        if (dst[u] != nullptr) dst[u][v] = values[u];
      }
    }
  }
}

template <int Bytes, typename Index, int Rows>
void launch(const GpuRows& t, const Index* idx, const int64_t* positions, int64_t count, char* out,
            DeviceIndexError* error, int max_blocks, cudaStream_t stream) {
  using V = typename Vector<Bytes>::type;
  const int64_t vectors = t.row_bytes / Bytes;
  const int lanes = lanes_per_row(vectors);
  row_gather_kernel<V, Index, Rows><<<grid_for((count + Rows - 1) / Rows, lanes, max_blocks), kThreadsPerBlock, 0,
                                      stream>>>(t.base, t.num_rows, t.row_stride_bytes, vectors, lanes, idx,
                                                positions, count, reinterpret_cast<V*>(out), error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Rows in flight as a template argument (the per-row arrays stay in registers); every choice for the 16- and
// 8-byte accesses rows of 4-byte elements use, 4 for the rest.
template <int Bytes, typename Index>
void launch_rows(const GpuRows& t, const Index* idx, const int64_t* positions, int64_t count, char* out,
                 DeviceIndexError* error, const RowLaunch& l, cudaStream_t stream) {
  if constexpr (Bytes >= 8) {
    switch (rows_in_flight_for(count, lanes_per_row(t.row_bytes / Bytes), l.max_blocks, l.rows_in_flight)) {
      case 1: return launch<Bytes, Index, 1>(t, idx, positions, count, out, error, l.max_blocks, stream);
      case 2: return launch<Bytes, Index, 2>(t, idx, positions, count, out, error, l.max_blocks, stream);
      case 8: return launch<Bytes, Index, 8>(t, idx, positions, count, out, error, l.max_blocks, stream);
      default: break;
    }
  }
  launch<Bytes, Index, 4>(t, idx, positions, count, out, error, l.max_blocks, stream);
}

template <typename Index>
void launch_for_index(const GpuRows& t, const Index* idx, const int64_t* positions, int64_t count, char* out,
                      DeviceIndexError* error, const RowLaunch& l, cudaStream_t stream) {
  const int width = widest_access_bytes({static_cast<uint64_t>(t.row_bytes), static_cast<uint64_t>(t.row_stride_bytes),
                                         reinterpret_cast<uint64_t>(t.base), reinterpret_cast<uint64_t>(out)});
  switch (width) {
    case 16: return launch_rows<16>(t, idx, positions, count, out, error, l, stream);
    case 8: return launch_rows<8>(t, idx, positions, count, out, error, l, stream);
    case 4: return launch_rows<4>(t, idx, positions, count, out, error, l, stream);
    case 2: return launch_rows<2>(t, idx, positions, count, out, error, l, stream);
    default: return launch_rows<1>(t, idx, positions, count, out, error, l, stream);
  }
}

}  // namespace

void launch_row_gather(const GpuRows& table, const GpuIndices& indices, char* out, DeviceIndexError* error,
                       const RowLaunch& launch, cudaStream_t stream) {
  if (indices.count == 0 || table.row_bytes == 0) return;
  if (indices.is_int64) {
    launch_for_index(table, static_cast<const int64_t*>(indices.data), indices.positions, indices.count, out, error,
                     launch, stream);
  } else {
    launch_for_index(table, static_cast<const int32_t*>(indices.data), indices.positions, indices.count, out, error,
                     launch, stream);
  }
}

}  // namespace speedtorch

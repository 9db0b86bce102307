// GPU gather with dequantization inside (see gather_dequant_kernel.h).
//
// Over UVA a warp's loads cross PCIe, so what sets the rate is how many bytes are in flight and how the host pages
// are touched (docs/engram.md; ../shared/probes/uva_reference.py measured 0.72-0.75 of memcpy with these loads
// against 0.62 with plain ones). So each warp reads several rows at once: every lane issues its vector of each of
// kRows rows before it uses any, with non-coherent streaming loads (ld.global.cs: each byte is read once, so it
// should not displace anything in the caches). The raw rows land in shared memory; the warp then dequantizes
// them element by element (core/row_formats.h, the CPU loop's code) with coalesced 2-byte stores. bf16 rows need
// no dequantization: their vectors go straight to the output.
#include <c10/cuda/CUDAException.h>

#include <algorithm>

#include "cuda/gather_dequant_kernel.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

using row_access::kThreadsPerBlock;
constexpr int kWarpsPerBlock = kThreadsPerBlock / 32;

template <typename V>
__device__ __forceinline__ V load_streaming(const V* p);
template <>
__device__ __forceinline__ uint4 load_streaming(const uint4* p) { return __ldcs(p); }
template <>
__device__ __forceinline__ uint2 load_streaming(const uint2* p) { return __ldcs(p); }
template <>
__device__ __forceinline__ uint32_t load_streaming(const uint32_t* p) { return __ldcs(p); }
template <>
__device__ __forceinline__ uint16_t load_streaming(const uint16_t* p) {
  return __ldcs(reinterpret_cast<const unsigned short*>(p));
}
template <>
__device__ __forceinline__ uint8_t load_streaming(const uint8_t* p) {
  return static_cast<uint8_t>(__ldcs(reinterpret_cast<const unsigned char*>(p)));
}

// kRows rows per warp at a time; `vectors` V-sized loads cover a row's data (format_row_bytes rounded up to V, which
// divides the row width the table spans: no load leaves the row). Dequantize: stage in shared memory and convert;
// else (bf16) copy the vectors to the output.
template <typename V, typename Index, int kRows, bool kDequantize>
__global__ void __launch_bounds__(kThreadsPerBlock)
    gather_dequant_kernel(QuantizedGpuRows t, int64_t vectors, const Index* __restrict__ indices,
                          const int64_t* __restrict__ positions, int64_t count, c10::BFloat16* __restrict__ out,
                          DeviceIndexError* error) {
  extern __shared__ uint4 shared_rows[];  // kWarpsPerBlock x kRows x vectors of V (dequantizing only)
  const int lane = static_cast<int>(threadIdx.x % 32);
  V* staged = reinterpret_cast<V*>(shared_rows) + (threadIdx.x / 32) * kRows * vectors;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t out_vectors = t.dim * 2 / static_cast<int64_t>(sizeof(V));  // bf16 copies only

  for (int64_t first = warp * kRows; first < count; first += warps * kRows) {
    // Lane r < kRows reads entry first + r's index; every lane learns all of them.
    int64_t my_row = -1, my_position = 0;
    bool my_ok = false;
    if (lane < kRows && first + lane < count) {
      const int64_t i = first + lane;
      my_row = indices != nullptr ? static_cast<int64_t>(indices[i]) : i;
      my_position = positions != nullptr ? positions[i] : i;
      my_ok = my_row >= 0 && my_row < t.num_rows;
      if (!my_ok && atomicCAS(&error->flag, 0, 1) == 0) {
        error->kind = kBadRowIndex;
        error->value = my_row;
        error->position = my_position;
        error->num_rows = t.num_rows;
      }
    }
    const V* src[kRows];
    int64_t position[kRows];
    bool ok[kRows];
    bool present[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const long long row = __shfl_sync(0xffffffffu, static_cast<long long>(my_row), r);
      position[r] = __shfl_sync(0xffffffffu, static_cast<long long>(my_position), r);
      ok[r] = __shfl_sync(0xffffffffu, static_cast<int>(my_ok), r) != 0;
      present[r] = first + r < count;
      src[r] = reinterpret_cast<const V*>(t.base + (ok[r] ? row : 0) * t.row_stride_bytes);
    }
    // Every lane issues its load of each row before it uses any.
    for (int64_t c0 = 0; c0 < vectors; c0 += 32) {
      const int64_t c = c0 + lane;
      V v[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (c < vectors && ok[r]) v[r] = load_streaming(src[r] + c);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (c >= vectors || !present[r]) continue;
        if (kDequantize) {
          if (ok[r]) staged[r * vectors + c] = v[r];
        } else if (c < out_vectors) {
          reinterpret_cast<V*>(out + position[r] * t.dim)[c] = ok[r] ? v[r] : row_access::all_ones<V>();
        }
      }
    }
    if (kDequantize) {
      __syncwarp();
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (!present[r]) continue;
        c10::BFloat16* dst = out + position[r] * t.dim;
        const auto* row = reinterpret_cast<const uint8_t*>(staged + r * vectors);
        const c10::BFloat16 nan(0xFFFF, c10::BFloat16::from_bits());  // a row left unread is never data
        for (int64_t j = lane; j < t.dim; j += 32) dst[j] = ok[r] ? dequantize_element(t.format, row, t.dim, j) : nan;
      }
      __syncwarp();  // the next rows overwrite the staging area
    }
  }
}

template <typename V, typename Index, int kRows>
void launch_shaped(const QuantizedGpuRows& t, const GpuIndices& indices, c10::BFloat16* out, DeviceIndexError* error,
                   int max_blocks, cudaStream_t stream) {
  const int64_t vectors = (format_row_bytes(t.format, t.dim) + sizeof(V) - 1) / sizeof(V);
  const bool dequantize = t.format != RowFormat::kBFloat16;
  const size_t shared = dequantize ? static_cast<size_t>(kWarpsPerBlock) * kRows * vectors * sizeof(V) : 0;
  const int64_t warps_needed = (indices.count + kRows - 1) / kRows;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((warps_needed + kWarpsPerBlock - 1) / kWarpsPerBlock,
                                                                std::max(1, max_blocks)));
  const auto* idx = static_cast<const Index*>(indices.data);
  if (dequantize) {
    gather_dequant_kernel<V, Index, kRows, true><<<static_cast<unsigned>(blocks), kThreadsPerBlock, shared, stream>>>(
        t, vectors, idx, indices.positions, indices.count, out, error);
  } else {
    gather_dequant_kernel<V, Index, kRows, false><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
        t, vectors, idx, indices.positions, indices.count, out, error);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Rows in flight per warp: as many as keep every warp of the grid busy (a decode-size batch is spread over more
// warps, each with fewer rows to convert one after the other), at most eight, and as the staging area allows
// (48 KiB of shared memory per block).
template <typename V, typename Index>
void launch_for_rows(const QuantizedGpuRows& t, const GpuIndices& indices, c10::BFloat16* out, DeviceIndexError* error,
                     int max_blocks, cudaStream_t stream) {
  const int64_t row_bytes = format_row_bytes(t.format, t.dim);
  const int64_t per_row = t.format == RowFormat::kBFloat16 ? 0 : kWarpsPerBlock * (row_bytes + 16);
  const int64_t grid_warps = static_cast<int64_t>(std::max(1, max_blocks)) * kWarpsPerBlock;
  auto fits = [&](int rows) { return per_row * rows <= 48 * 1024 && indices.count >= grid_warps * rows; };
  if (fits(8)) return launch_shaped<V, Index, 8>(t, indices, out, error, max_blocks, stream);
  if (fits(4)) return launch_shaped<V, Index, 4>(t, indices, out, error, max_blocks, stream);
  if (fits(2)) return launch_shaped<V, Index, 2>(t, indices, out, error, max_blocks, stream);
  return launch_shaped<V, Index, 1>(t, indices, out, error, max_blocks, stream);
}

template <typename Index>
void launch_for_index(const QuantizedGpuRows& t, const GpuIndices& indices, c10::BFloat16* out,
                      DeviceIndexError* error, int max_blocks, cudaStream_t stream) {
  // The widest vector every row start allows; bf16 rows are also stored by it, so the output must allow it too.
  const int64_t row_bytes = format_row_bytes(t.format, t.dim);
  int width = row_access::widest_access_bytes({static_cast<uint64_t>(t.row_stride_bytes),
                                               static_cast<uint64_t>(t.row_width_bytes),
                                               reinterpret_cast<uint64_t>(t.base)});
  if (t.format == RowFormat::kBFloat16) {
    width = std::min(width, row_access::widest_access_bytes({static_cast<uint64_t>(row_bytes),
                                                             reinterpret_cast<uint64_t>(out)}));
  }
  switch (width) {
    case 16: return launch_for_rows<uint4, Index>(t, indices, out, error, max_blocks, stream);
    case 8: return launch_for_rows<uint2, Index>(t, indices, out, error, max_blocks, stream);
    case 4: return launch_for_rows<uint32_t, Index>(t, indices, out, error, max_blocks, stream);
    case 2: return launch_for_rows<uint16_t, Index>(t, indices, out, error, max_blocks, stream);
    default: return launch_for_rows<uint8_t, Index>(t, indices, out, error, max_blocks, stream);
  }
}

}  // namespace

void launch_gather_dequant(const QuantizedGpuRows& table, const GpuIndices& indices, c10::BFloat16* out,
                           DeviceIndexError* error, int max_blocks, cudaStream_t stream) {
  if (indices.count == 0 || table.dim == 0) return;
  if (indices.is_int64 || indices.data == nullptr) {
    launch_for_index<int64_t>(table, indices, out, error, max_blocks, stream);
  } else {
    launch_for_index<int32_t>(table, indices, out, error, max_blocks, stream);
  }
}

}  // namespace speedtorch

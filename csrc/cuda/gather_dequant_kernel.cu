// GPU gather with dequantization inside (see gather_dequant_kernel.h).
//
// Over UVA a warp's loads cross PCIe and wait microseconds for their answer, so the rate is set by the bytes each
// warp keeps in flight, as in the plain row gather (row_gather_kernel.cu: 0.88-0.90 of memcpy with `rows_in_flight`
// 16-byte loads a lane). This kernel keeps that profile for rows of any size: a warp takes a group of rows whose
// raw bytes fill its `kLoads` loads a lane (seven 272-byte fp8 rows of dim 256 for four 16-byte loads), spread over
// all 32 lanes as one flat run of vectors, and issues every load of the group before it uses any. The raw rows land
// in shared memory and the warp converts them element by element (core/row_formats.h, the CPU loop's code) while
// the loads of its next group are already in flight: no warp leaves the link idle while it computes. bf16 rows need
// no conversion: their vectors go straight to the output.
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <climits>

#include "cuda/gather_dequant_kernel.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

using row_access::kThreadsPerBlock;
constexpr int kWarpsPerBlock = kThreadsPerBlock / 32;
constexpr unsigned kAllLanes = 0xffffffffu;

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

// A group of rows as the warp holds it: lane r knows entry first + r (r < rows): its row's address (null for a bad
// index), its output position and whether its index was good. Lanes learn the others' by shuffles.
struct Group {
  int64_t first = 0;
  int rows = 0;  // 0: the warp has no more groups
  const char* src = nullptr;
  int64_t position = 0;
  bool ok = false;
};

// Reads the indices of the group at `first` (at most `group_rows` entries) and flags a bad one in `error`.
template <typename Index>
__device__ Group look_up(const QuantizedGpuRows& t, const Index* indices, const int64_t* positions, int64_t count,
                         int64_t first, int group_rows, DeviceIndexError* error, int lane) {
  Group g;
  g.first = first;
  g.rows = first < count ? static_cast<int>(std::min<int64_t>(group_rows, count - first)) : 0;
  if (lane < g.rows) {
    const int64_t i = first + lane;
    const int64_t row = indices != nullptr ? static_cast<int64_t>(indices[i]) : i;
    g.position = positions != nullptr ? positions[i] : i;
    g.ok = row >= 0 && row < t.num_rows;
    if (g.ok) {
      g.src = t.base + row * t.row_stride_bytes;
    } else if (atomicCAS(&error->flag, 0, 1) == 0) {
      error->kind = kBadRowIndex;
      error->value = row;
      error->position = g.position;
      error->num_rows = t.num_rows;
    }
  }
  return g;
}

// Issues the loads of flat vectors [chunk, chunk + 32 kLoads) of group g (vector c of its row r is flat vector
// r * vectors + c): lane l takes chunk + 32 k + l. Rows of bad indices are not read.
template <typename V, int kLoads>
__device__ __forceinline__ void issue_loads(V (&v)[kLoads], const Group& g, int chunk, int vectors, int lane) {
  const int group_vectors = g.rows * vectors;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int f = chunk + 32 * k + lane;
    const int r = std::min(f, group_vectors - 1) / vectors;  // every lane shuffles, from a lane of the group
    const auto* src = reinterpret_cast<const V*>(
        __shfl_sync(kAllLanes, reinterpret_cast<unsigned long long>(g.src), r));
    if (f < group_vectors && src != nullptr) v[k] = load_streaming(src + (f - r * vectors));
  }
}

// Puts the vectors loaded by issue_loads where they go: the warp's staging area (to be converted), or, for bf16
// rows, the output (NaN bytes for a bad index, as the row gather writes).
template <typename V, int kLoads, bool kDequantize>
__device__ __forceinline__ void take_loads(const V (&v)[kLoads], const Group& g, int chunk, int vectors, int lane,
                                           V* staged, c10::BFloat16* out, int64_t dim) {
  const int group_vectors = g.rows * vectors;
#pragma unroll
  for (int k = 0; k < kLoads; ++k) {
    const int f = chunk + 32 * k + lane;
    if (kDequantize) {
      if (f < group_vectors) staged[f] = v[k];
    } else {
      const int r = std::min(f, group_vectors - 1) / vectors;
      const int64_t position = __shfl_sync(kAllLanes, static_cast<long long>(g.position), r);
      const bool ok = __shfl_sync(kAllLanes, static_cast<int>(g.ok), r) != 0;
      if (f < group_vectors) {
        reinterpret_cast<V*>(out + position * dim)[f - r * vectors] = ok ? v[k] : row_access::all_ones<V>();
      }
    }
  }
}

// Converts the staged rows of group g to bfloat16, one row at a time with coalesced 2-byte stores; a row of a bad
// index becomes NaN, never data.
template <typename V>
__device__ void dequantize_group(const QuantizedGpuRows& t, const Group& g, const V* staged, int vectors,
                                 c10::BFloat16* out, int lane) {
  const c10::BFloat16 nan(0xFFFF, c10::BFloat16::from_bits());
  for (int r = 0; r < g.rows; ++r) {
    const int64_t position = __shfl_sync(kAllLanes, static_cast<long long>(g.position), r);
    const bool ok = __shfl_sync(kAllLanes, static_cast<int>(g.ok), r) != 0;
    const auto* row = reinterpret_cast<const uint8_t*>(staged + r * vectors);
    c10::BFloat16* dst = out + position * t.dim;
    for (int64_t j = lane; j < t.dim; j += 32) dst[j] = ok ? dequantize_element(t.format, row, t.dim, j) : nan;
  }
}

// Each warp walks its groups (`group_rows` entries each, strided over the grid), a group in chunks of 32 kLoads
// vectors (one chunk unless a row alone exceeds it). The loads of the next chunk, or of the next group's first, are
// issued before the group just staged is converted.
template <typename V, typename Index, int kLoads, bool kDequantize>
__global__ void __launch_bounds__(kThreadsPerBlock)
    gather_dequant_kernel(QuantizedGpuRows t, int vectors, int group_rows, const Index* __restrict__ indices,
                          const int64_t* __restrict__ positions, int64_t count, c10::BFloat16* __restrict__ out,
                          DeviceIndexError* error) {
  extern __shared__ uint4 shared_rows[];  // kWarpsPerBlock x group_rows x vectors of V (dequantizing only)
  constexpr int kChunk = 32 * kLoads;
  const int lane = static_cast<int>(threadIdx.x % 32);
  V* staged = reinterpret_cast<V*>(shared_rows) + (threadIdx.x / 32) * group_rows * vectors;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x / 32 * group_rows;

  Group group = look_up(t, indices, positions, count, warp * group_rows, group_rows, error, lane);
  if (group.rows == 0) return;
  V v[kLoads] = {};
  int chunk = 0;
  issue_loads(v, group, chunk, vectors, lane);
  while (true) {
    // What the next loads are for: this group's next chunk, or the next group, whose indices are read before this
    // chunk's loads are waited for.
    const bool group_done = chunk + kChunk >= group.rows * vectors;
    const Group next =
        group_done ? look_up(t, indices, positions, count, group.first + step, group_rows, error, lane) : group;
    const int next_chunk = group_done ? 0 : chunk + kChunk;
    take_loads<V, kLoads, kDequantize>(v, group, chunk, vectors, lane, staged, out, t.dim);
    if (next.rows > 0) issue_loads(v, next, next_chunk, vectors, lane);
    if (group_done) {
      if (kDequantize) {
        __syncwarp();  // the staged rows are complete
        dequantize_group(t, group, staged, vectors, out, lane);
        __syncwarp();  // and read: the next group may overwrite them
      }
      if (next.rows == 0) return;
      group = next;
    }
    chunk = next_chunk;
  }
}

// Rows a group holds: as many as fill kLoads loads a lane (at least one, at most one a lane).
int group_rows_for(int64_t vectors, int loads) {
  return static_cast<int>(std::clamp<int64_t>(32 * static_cast<int64_t>(loads) / vectors, 1, 32));
}

int64_t blocks_for(int64_t count, int group_rows, int max_blocks) {
  const int64_t groups = (count + group_rows - 1) / group_rows;
  return std::clamp<int64_t>((groups + kWarpsPerBlock - 1) / kWarpsPerBlock, 1, std::max(1, max_blocks));
}

template <typename V, typename Index, int kLoads>
void launch_shaped(const QuantizedGpuRows& t, const GpuIndices& indices, c10::BFloat16* out, DeviceIndexError* error,
                   int max_blocks, cudaStream_t stream) {
  const int64_t vectors = (format_row_bytes(t.format, t.dim) + sizeof(V) - 1) / sizeof(V);
  TORCH_CHECK(vectors <= INT_MAX / 64, "speedtorch.gather_dequant: rows of ", vectors * sizeof(V),
              " bytes are too large for the GPU kernel");
  const int group_rows = group_rows_for(vectors, kLoads);
  const bool dequantize = t.format != RowFormat::kBFloat16;
  const size_t shared = dequantize ? static_cast<size_t>(kWarpsPerBlock) * group_rows * vectors * sizeof(V) : 0;
  const auto blocks = static_cast<unsigned>(blocks_for(indices.count, group_rows, max_blocks));
  const auto* idx = static_cast<const Index*>(indices.data);
  const int n = static_cast<int>(vectors);
  if (dequantize) {
    gather_dequant_kernel<V, Index, kLoads, true><<<blocks, kThreadsPerBlock, shared, stream>>>(
        t, n, group_rows, idx, indices.positions, indices.count, out, error);
  } else {
    gather_dequant_kernel<V, Index, kLoads, false><<<blocks, kThreadsPerBlock, 0, stream>>>(
        t, n, group_rows, idx, indices.positions, indices.count, out, error);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// 16-byte loads a lane in flight: `wanted` (the row gather's rows in flight), halved while smaller groups would
// spread a small batch over more of the grid's blocks (a decode-size batch: more warps, each converting fewer rows).
int loads_in_flight(int64_t count, int64_t vectors, int loads_per_16_bytes, int max_blocks, int wanted) {
  int loads = std::clamp(wanted, 1, 8);
  auto rows = [&](int l) { return group_rows_for(vectors, l * loads_per_16_bytes); };
  while (loads > 1 && blocks_for(count, rows(loads), max_blocks) < max_blocks && rows(loads / 2) < rows(loads)) {
    loads /= 2;
  }
  return loads;
}

// The loads a lane as a template argument (they stay in registers): every choice for 16- and 8-byte vectors,
// 16 narrower ones (64, 32 or 16 bytes a lane) for rows whose layout allows no wider access.
template <typename V, typename Index>
void launch_for_rows(const QuantizedGpuRows& t, const GpuIndices& indices, c10::BFloat16* out, DeviceIndexError* error,
                     const RowLaunch& l, cudaStream_t stream) {
  if constexpr (sizeof(V) >= 8) {
    constexpr int kPer16 = 16 / sizeof(V);
    const int64_t vectors = (format_row_bytes(t.format, t.dim) + sizeof(V) - 1) / sizeof(V);
    switch (loads_in_flight(indices.count, vectors, kPer16, l.max_blocks, l.rows_in_flight)) {
      case 1: return launch_shaped<V, Index, kPer16>(t, indices, out, error, l.max_blocks, stream);
      case 2: return launch_shaped<V, Index, 2 * kPer16>(t, indices, out, error, l.max_blocks, stream);
      case 8: return launch_shaped<V, Index, 8 * kPer16>(t, indices, out, error, l.max_blocks, stream);
      default: return launch_shaped<V, Index, 4 * kPer16>(t, indices, out, error, l.max_blocks, stream);
    }
  } else {
    launch_shaped<V, Index, 16>(t, indices, out, error, l.max_blocks, stream);
  }
}

template <typename Index>
void launch_for_index(const QuantizedGpuRows& t, const GpuIndices& indices, c10::BFloat16* out,
                      DeviceIndexError* error, const RowLaunch& l, cudaStream_t stream) {
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
    case 16: return launch_for_rows<uint4, Index>(t, indices, out, error, l, stream);
    case 8: return launch_for_rows<uint2, Index>(t, indices, out, error, l, stream);
    case 4: return launch_for_rows<uint32_t, Index>(t, indices, out, error, l, stream);
    case 2: return launch_for_rows<uint16_t, Index>(t, indices, out, error, l, stream);
    default: return launch_for_rows<uint8_t, Index>(t, indices, out, error, l, stream);
  }
}

}  // namespace

void launch_gather_dequant(const QuantizedGpuRows& table, const GpuIndices& indices, c10::BFloat16* out,
                           DeviceIndexError* error, const RowLaunch& launch, cudaStream_t stream) {
  if (indices.count == 0 || table.dim == 0) return;
  if (indices.is_int64 || indices.data == nullptr) {
    launch_for_index<int64_t>(table, indices, out, error, launch, stream);
  } else {
    launch_for_index<int32_t>(table, indices, out, error, launch, stream);
  }
}

}  // namespace speedtorch

// Fused row optimizer kernel: one group of lanes per row reads the row's weights and state (over UVA when they
// live in pinned host memory), applies the optimizer (core/row_optimizer_math.h) and writes both back, in one
// pass. The rows come sorted, so warps running together touch nearby host pages. Row ids are checked against the
// table here too, not only by the op before the launch: an id the caller changed after that check (pinned CPU
// indices still being copied) must never become a write outside the table; it is flagged in the device's index
// error record (cuda/device_index_error.h) and its row left alone.
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>

#include "cuda/row_optimizer_kernel.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

using row_access::kThreadsPerBlock;

// Where a thread works: groups of `lanes` threads (a power of two, at most a warp) share a row; the grid strides
// over the rows.
struct RowLanes {
  int64_t first_row;
  int64_t stride_rows;
  int lane;
  unsigned group_mask;  // the lanes of this thread's group, for __syncwarp
  __device__ explicit RowLanes(int lanes) {
    const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    first_row = thread / lanes;
    stride_rows = static_cast<int64_t>(gridDim.x) * blockDim.x / lanes;
    lane = static_cast<int>(thread % lanes);
    const int warp_lane = static_cast<int>(threadIdx.x % 32);
    group_mask = lanes == 32 ? 0xffffffffu : (((1u << lanes) - 1u) << (warp_lane / lanes * lanes));
  }
};

// The sum of `value` over the lanes of this thread's group (every lane gets it).
__device__ float group_sum(float value, const RowLanes& pos, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(pos.group_mask, value, offset);
  return value;
}

// Whether rows[i] is above rows[i - 1] where the rows were claimed strictly increasing (OptimizerRows::
// rows_must_increase); flags it (once per group: lane 0) when not. A row repeated next to itself would otherwise be
// updated by two groups at once.
__device__ bool row_follows_previous(const OptimizerRows& t, const int64_t* rows, int64_t i, int lane,
                                     DeviceIndexError* error) {
  if (!t.rows_must_increase || i == 0 || rows[i] > rows[i - 1]) return true;
  if (lane == 0 && atomicCAS(&error->flag, 0, 1) == 0) {
    error->kind = kUnsortedRows;
    error->value = rows[i];
    error->position = i;
    error->num_rows = t.num_rows;
  }
  return false;
}

// Where the i-th row of the batch's updated weights go besides the table (OptimizerRows::updated), or nullptr.
template <typename T>
__device__ T* updated_row(const OptimizerRows& t, int64_t i) {
  return t.updated == nullptr ? nullptr : reinterpret_cast<T*>(t.updated) + i * t.dim;
}

// Whether `row` is one of the table's; flags it (once per group: lane 0) when not.
__device__ bool row_in_table(int64_t row, int64_t position, int64_t num_rows, int lane, DeviceIndexError* error) {
  if (row >= 0 && row < num_rows) return true;
  if (lane == 0 && atomicCAS(&error->flag, 0, 1) == 0) {
    error->value = row;
    error->position = position;
    error->num_rows = num_rows;
  }
  return false;
}

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    row_optimizer_kernel(OptimizerRows t, OptimizerHyper h, int64_t global_step, const int64_t* __restrict__ rows,
                         const float* __restrict__ grads, int64_t count, int lanes, DeviceIndexError* error) {
  const RowLanes pos(lanes);
  for (int64_t i = pos.first_row; i < count; i += pos.stride_rows) {
    const int64_t row = rows[i];
    if (!row_in_table(row, i, t.num_rows, pos.lane, error) || !row_follows_previous(t, rows, i, pos.lane, error)) {
      continue;
    }
    T* w = reinterpret_cast<T*>(t.weights + row * t.weight_stride_bytes);
    float* header = t.state + row * t.state_stride_floats;
    auto* step = reinterpret_cast<int32_t*>(header);
    const int32_t k = *step + 1;
    RowStep r = row_step(h, k, global_step);
    const float* g = grads + i * t.dim;
    float row_scalar = 0.f;
    if (is_rowwise(h.kind)) {  // the row's mean squared gradient, before any element moves
      float part = 0.f;
      for (int64_t j = pos.lane; j < t.dim; j += lanes) {
        const float gj = decayed_gradient(h, static_cast<float>(w[j]), g[j]);
        part += gj * gj;
      }
      const float sum_squares = group_sum(part, pos, lanes);
      if (h.kind == OptimizerKind::kRowwiseAdagrad) {
        r.clr = rowwise_adagrad_scale(h, header[kRowwiseAccumulatorFloat], r.first, sum_squares, t.dim, &row_scalar);
      } else {
        r.denom = rowwise_adam_denominator(h, r, header[kRowwiseAccumulatorFloat], sum_squares, t.dim, &row_scalar);
      }
    }
    __syncwarp(pos.group_mask);  // every lane has read the header before lane 0 moves it on
    if (pos.lane == 0) {
      *step = k;
      if (is_rowwise(h.kind)) header[kRowwiseAccumulatorFloat] = row_scalar;
    }
    float* s0 = header + kStateHeaderFloats;
    float* s1 = s0 + t.dim;
    float* s2 = s1 + t.dim;
    T* kept = updated_row<T>(t, i);
    for (int64_t j = pos.lane; j < t.dim; j += lanes) {
      const T value = rounded_weight<T>(h, update_element(h, r, static_cast<float>(w[j]), g[j], s0 + j, s1 + j,
                                                          s2 + j),
                                        global_step, row, j);
      w[j] = value;
      if (kept != nullptr) kept[j] = value;
    }
  }
}

// Row-wise Adagrad (the recommenders' optimizer: one float of state per row) for rows of at most
// `PerLane` x lanes elements: the scalar kernel's arithmetic in its order, bit for bit, but each lane keeps its
// elements of the row in registers between the reduction and the update, so the row crosses PCIe once each way
// (the scalar kernel reads it twice), and each group keeps `Rows` rows in flight. The header (step count and
// accumulator) moves as one 16-byte access each way: small accesses each cost a PCIe transaction of their own.
// Needs 16-byte aligned state rows.
template <typename T, int Rows, int PerLane>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rowwise_adagrad_kernel(OptimizerRows t, OptimizerHyper h, int64_t global_step, const int64_t* __restrict__ rows,
                           const float* __restrict__ grads, int64_t count, int lanes, DeviceIndexError* error) {
  using row_access::load_streaming;
  using row_access::store_streaming;
  const RowLanes pos(lanes);
  for (int64_t first = pos.first_row * Rows; first < count; first += pos.stride_rows * Rows) {
    T* w[Rows];
    float4* header[Rows];  // one 16-byte access each way: step count (int bits), accumulator, two spare floats
    float4 head[Rows];
    int32_t k[Rows];
    T wv[Rows][PerLane];
    float gv[Rows][PerLane];
    int64_t row_id[Rows];  // for stochastic rounding's random bits
#pragma unroll
    for (int u = 0; u < Rows; ++u) {  // every load of the rows first
      const int64_t i = first + u;
      w[u] = nullptr;
      if (i >= count) continue;
      const int64_t row = rows[i];
      if (!row_in_table(row, i, t.num_rows, pos.lane, error) || !row_follows_previous(t, rows, i, pos.lane, error)) {
        continue;
      }
      row_id[u] = row;
      w[u] = reinterpret_cast<T*>(t.weights + row * t.weight_stride_bytes);
      header[u] = reinterpret_cast<float4*>(t.state + row * t.state_stride_floats);
      head[u] = load_streaming(header[u]);
      k[u] = __float_as_int(head[u].x) + 1;
      const float* g = grads + i * t.dim;
#pragma unroll
      for (int m = 0; m < PerLane; ++m) {
        const int64_t j = pos.lane + static_cast<int64_t>(m) * lanes;
        if (j < t.dim) {
          wv[u][m] = load_streaming(w[u] + j);
          gv[u][m] = g[j];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < Rows; ++u) {
      if (w[u] == nullptr) continue;  // the same for every lane of the group: group_sum below is safe
      float part = 0.f;
#pragma unroll
      for (int m = 0; m < PerLane; ++m) {
        if (pos.lane + static_cast<int64_t>(m) * lanes < t.dim) {
          const float gj = decayed_gradient(h, static_cast<float>(wv[u][m]), gv[u][m]);
          part += gj * gj;
        }
      }
      RowStep r = row_step(h, k[u], global_step);
      float new_accumulator = 0.f;
      static_assert(kRowwiseAccumulatorFloat == 1, "the accumulator is the header's second float");
      r.clr = rowwise_adagrad_scale(h, head[u].y, r.first, group_sum(part, pos, lanes), t.dim, &new_accumulator);
      T* kept = updated_row<T>(t, first + u);
#pragma unroll
      for (int m = 0; m < PerLane; ++m) {
        const int64_t j = pos.lane + static_cast<int64_t>(m) * lanes;
        if (j < t.dim) {
          const T value = rounded_weight<T>(h, update_element(h, r, static_cast<float>(wv[u][m]), gv[u][m], nullptr,
                                                              nullptr, nullptr),
                                            global_step, row_id[u], j);
          store_streaming(w[u] + j, value);
          if (kept != nullptr) kept[j] = value;
        }
      }
      if (pos.lane == 0) {  // every lane read the header in the first loop, before any lane got here
        store_streaming(header[u], make_float4(__int_as_float(k[u]), new_accumulator, head[u].z, head[u].w));
      }
    }
  }
}

// Row-wise Adagrad on rows of 128 x K elements with 16-byte accesses: lane l holds vectors l, l + 32, ... (elements
// 4v .. 4v + 3 of vector v). The reduction must add the squares in the scalar kernels' order (lane l: elements
// l, l + 32, l + 64, ..., then a butterfly over the lanes), so each lane fetches those squares from the lanes
// holding them (element j = l + 32m sits in vector l/4 + 8m, i.e. in lane 8(m % 4) + l/4's vector m/4, at slot
// l % 4). The sums, and so every bit of the update, are the scalar kernels'; the row moves in 16-byte accesses, as
// the other optimizers' rows do (the scalar layout's 4-byte accesses ran the step at half the duplex copy rate).
template <typename T, int Rows, int K>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rowwise_adagrad_vec4_kernel(OptimizerRows t, OptimizerHyper h, int64_t global_step,
                                const int64_t* __restrict__ rows, const float* __restrict__ grads, int64_t count,
                                DeviceIndexError* error) {
  using WeightVector = typename row_access::Vector<4 * sizeof(T)>::type;
  using row_access::load_streaming;
  using row_access::store_streaming;
  constexpr int kLanes = 32;
  const RowLanes pos(kLanes);
  const int lane = pos.lane;
  for (int64_t first = pos.first_row * Rows; first < count; first += pos.stride_rows * Rows) {
    WeightVector* w[Rows];
    float4* header[Rows];
    float4 head[Rows];
    WeightVector wv[Rows][K];
    float4 gv[Rows][K];
    int64_t row_id[Rows];  // for stochastic rounding's random bits
#pragma unroll
    for (int u = 0; u < Rows; ++u) {  // every load of the rows first
      const int64_t i = first + u;
      w[u] = nullptr;
      if (i >= count) continue;
      const int64_t row = rows[i];
      if (!row_in_table(row, i, t.num_rows, lane, error) || !row_follows_previous(t, rows, i, lane, error)) continue;
      row_id[u] = row;
      w[u] = reinterpret_cast<WeightVector*>(t.weights + row * t.weight_stride_bytes);
      header[u] = reinterpret_cast<float4*>(t.state + row * t.state_stride_floats);
      head[u] = load_streaming(header[u]);
      const auto* g = reinterpret_cast<const float4*>(grads + i * t.dim);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        wv[u][k] = load_streaming(w[u] + lane + kLanes * k);
        gv[u][k] = g[lane + kLanes * k];
      }
    }
#pragma unroll
    for (int u = 0; u < Rows; ++u) {
      if (w[u] == nullptr) continue;  // the same for the whole warp (one row): the shuffles below are safe
      T wt[K][4];
      float gs[K][4];
      float decayed[K][4];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        memcpy(wt[k], &wv[u][k], sizeof(WeightVector));
        gs[k][0] = gv[u][k].x;
        gs[k][1] = gv[u][k].y;
        gs[k][2] = gv[u][k].z;
        gs[k][3] = gv[u][k].w;
#pragma unroll
        for (int e = 0; e < 4; ++e) decayed[k][e] = decayed_gradient(h, static_cast<float>(wt[k][e]), gs[k][e]);
      }
      // The decayed gradients move, not their squares: `part += gj * gj` then compiles to the same fused
      // multiply-add as in the scalar kernels, rounding alike.
      float part = 0.f;
#pragma unroll
      for (int m = 0; m < 4 * K; ++m) {
        const int source = 8 * (m % 4) + lane / 4;
        float slot[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) slot[e] = __shfl_sync(0xffffffffu, decayed[m / 4][e], source);
        const int mine = lane % 4;
        const float gj = mine == 0 ? slot[0] : mine == 1 ? slot[1] : mine == 2 ? slot[2] : slot[3];
        part += gj * gj;
      }
      RowStep r = row_step(h, __float_as_int(head[u].x) + 1, global_step);
      float new_accumulator = 0.f;
      r.clr = rowwise_adagrad_scale(h, head[u].y, r.first, group_sum(part, pos, kLanes), t.dim, &new_accumulator);
#pragma unroll
      for (int k = 0; k < K; ++k) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          wt[k][e] = rounded_weight<T>(h, update_element(h, r, static_cast<float>(wt[k][e]), gs[k][e], nullptr, nullptr,
                                                         nullptr),
                                       global_step, row_id[u], 4 * (lane + kLanes * k) + e);
        }
        WeightVector out;
        memcpy(&out, wt[k], sizeof(out));
        store_streaming(w[u] + lane + kLanes * k, out);
        if (t.updated != nullptr) {
          reinterpret_cast<WeightVector*>(updated_row<T>(t, first + u))[lane + kLanes * k] = out;
        }
      }
      if (lane == 0) {
        store_streaming(header[u], make_float4(__int_as_float(__float_as_int(head[u].x) + 1), new_accumulator,
                                               head[u].z, head[u].w));
      }
    }
  }
}

// The same update, four elements per lane with 16-byte state accesses (8-byte weight accesses for 16-bit tables).
// Each group of lanes takes `Rows` consecutive rows and issues every load of them (weights, gradient, state, the
// row's step count) before the first is used, then the math, then the stores: over PCIe a row costs its bytes,
// not a round trip each. The header moves as one 16-byte access each way. Host rows are read and written with streaming accesses (row_vector_access.cuh), coherent
// ones: the kernel writes what it reads. Needs dim % 4 == 0 and 16-byte aligned rows and state rows.
template <typename T, int Rows>
__global__ void __launch_bounds__(kThreadsPerBlock)
    row_optimizer_vec4_kernel(OptimizerRows t, OptimizerHyper h, int64_t global_step,
                              const int64_t* __restrict__ rows, const float* __restrict__ grads, int64_t count,
                              int lanes, int slots, DeviceIndexError* error) {
  using WeightVector = typename row_access::Vector<4 * sizeof(T)>::type;
  using row_access::load_streaming;
  using row_access::store_streaming;
  const RowLanes pos(lanes);
  const int64_t vectors = t.dim / 4;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t first = pos.first_row * Rows; first < count; first += pos.stride_rows * Rows) {
    WeightVector* w[Rows];
    float* header[Rows];
    float4 head[Rows];  // the step count (int bits) and three floats this kernel leaves as they are
    const float4* g[Rows];
    int32_t k[Rows];
    int64_t row_id[Rows];  // for stochastic rounding's random bits
#pragma unroll
    for (int u = 0; u < Rows; ++u) {
      const int64_t i = first + u;
      w[u] = nullptr;
      if (i >= count) continue;
      const int64_t row = rows[i];
      if (!row_in_table(row, i, t.num_rows, pos.lane, error) || !row_follows_previous(t, rows, i, pos.lane, error)) {
        continue;
      }
      row_id[u] = row;
      w[u] = reinterpret_cast<WeightVector*>(t.weights + row * t.weight_stride_bytes);
      header[u] = t.state + row * t.state_stride_floats;
      g[u] = reinterpret_cast<const float4*>(grads + i * t.dim);
      head[u] = load_streaming(reinterpret_cast<const float4*>(header[u]));
      k[u] = __float_as_int(head[u].x) + 1;
    }
    for (int64_t v = pos.lane; v < vectors; v += lanes) {
      WeightVector wv[Rows];
      float4 gv[Rows], a[Rows], b[Rows], c[Rows];
#pragma unroll
      for (int u = 0; u < Rows; ++u) {  // loads first (none depends on another) ...
        if (w[u] == nullptr) continue;
        const auto* s0 = reinterpret_cast<const float4*>(header[u] + kStateHeaderFloats);
        wv[u] = load_streaming(w[u] + v);
        gv[u] = g[u][v];
        a[u] = slots > 0 ? load_streaming(s0 + v) : zero;
        b[u] = slots > 1 ? load_streaming(s0 + vectors + v) : zero;
        c[u] = slots > 2 ? load_streaming(s0 + 2 * vectors + v) : zero;
      }
#pragma unroll
      for (int u = 0; u < Rows; ++u) {  // ... then the math and the stores
        if (w[u] == nullptr) continue;
        const RowStep r = row_step(h, k[u], global_step);
        T wt[4];
        memcpy(wt, &wv[u], sizeof(WeightVector));
        const float gs[4] = {gv[u].x, gv[u].y, gv[u].z, gv[u].w};
        float* as = &a[u].x;
        float* bs = &b[u].x;
        float* cs = &c[u].x;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          wt[e] = rounded_weight<T>(h, update_element(h, r, static_cast<float>(wt[e]), gs[e], as + e, bs + e, cs + e),
                                    global_step, row_id[u], 4 * v + e);
        }
        WeightVector out;
        memcpy(&out, wt, sizeof(out));
        store_streaming(w[u] + v, out);
        if (t.updated != nullptr) reinterpret_cast<WeightVector*>(updated_row<T>(t, first + u))[v] = out;
        auto* s0 = reinterpret_cast<float4*>(header[u] + kStateHeaderFloats);
        if (slots > 0) store_streaming(s0 + v, a[u]);
        if (slots > 1) store_streaming(s0 + vectors + v, b[u]);
        if (slots > 2) store_streaming(s0 + 2 * vectors + v, c[u]);
      }
    }
    __syncwarp(pos.group_mask);  // every lane has read the counts before lane 0 moves them on
#pragma unroll
    for (int u = 0; u < Rows; ++u) {
      if (pos.lane == 0 && w[u] != nullptr) {
        store_streaming(reinterpret_cast<float4*>(header[u]),
                        make_float4(__int_as_float(k[u]), head[u].y, head[u].z, head[u].w));
      }
    }
  }
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T, int Rows>
void launch_vec4(const OptimizerRows& t, const OptimizerHyper& h, int64_t global_step, const int64_t* rows,
                 const float* grads, int64_t count, int max_blocks, DeviceIndexError* error, cudaStream_t stream) {
  const int lanes = row_access::lanes_per_row(t.dim / 4);
  row_optimizer_vec4_kernel<T, Rows>
      <<<row_access::grid_for((count + Rows - 1) / Rows, lanes, max_blocks), kThreadsPerBlock, 0, stream>>>(
          t, h, global_step, rows, grads, count, lanes, static_cast<int>(state_slots(h)), error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int Rows, int PerLane>
void launch_rowwise(const OptimizerRows& t, const OptimizerHyper& h, int64_t global_step, const int64_t* rows,
                    const float* grads, int64_t count, int lanes, const RowLaunch& l, DeviceIndexError* error,
                    cudaStream_t stream) {
  rowwise_adagrad_kernel<T, Rows, PerLane>
      <<<row_access::grid_for((count + Rows - 1) / Rows, lanes, l.max_blocks), kThreadsPerBlock, 0, stream>>>(
          t, h, global_step, rows, grads, count, lanes, error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int Rows, int K>
void launch_rowwise_vec4(const OptimizerRows& t, const OptimizerHyper& h, int64_t global_step, const int64_t* rows,
                         const float* grads, int64_t count, const RowLaunch& l, DeviceIndexError* error,
                         cudaStream_t stream) {
  rowwise_adagrad_vec4_kernel<T, Rows, K>
      <<<row_access::grid_for((count + Rows - 1) / Rows, 32, l.max_blocks), kThreadsPerBlock, 0, stream>>>(
          t, h, global_step, rows, grads, count, error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void launch_typed(const OptimizerRows& t, const OptimizerHyper& h, int64_t global_step, const int64_t* rows,
                  const float* grads, int64_t count, const RowLaunch& l, bool allow_vec4, DeviceIndexError* error,
                  cudaStream_t stream) {
  const int64_t wbytes = 4 * static_cast<int64_t>(sizeof(T));
  constexpr int kRowwisePerLane = 8;  // rows of up to 256 elements
  if (allow_vec4 && h.kind == OptimizerKind::kRowwiseAdagrad && t.dim % 128 == 0 && t.dim <= 512 &&
      aligned(t.weights, wbytes) && t.weight_stride_bytes % wbytes == 0 && aligned(grads, 16) &&
      aligned(t.state, 16) && t.state_stride_floats % 4 == 0) {
    const int rows_in_flight = row_access::rows_in_flight_for(count, 32, l.max_blocks, std::min(l.rows_in_flight, 2));
    switch (t.dim / 128 * 10 + rows_in_flight) {
      case 11: return launch_rowwise_vec4<T, 1, 1>(t, h, global_step, rows, grads, count, l, error, stream);
      case 12: return launch_rowwise_vec4<T, 2, 1>(t, h, global_step, rows, grads, count, l, error, stream);
      case 21: return launch_rowwise_vec4<T, 1, 2>(t, h, global_step, rows, grads, count, l, error, stream);
      case 22: return launch_rowwise_vec4<T, 2, 2>(t, h, global_step, rows, grads, count, l, error, stream);
      case 31: return launch_rowwise_vec4<T, 1, 3>(t, h, global_step, rows, grads, count, l, error, stream);
      case 32: return launch_rowwise_vec4<T, 2, 3>(t, h, global_step, rows, grads, count, l, error, stream);
      case 41: return launch_rowwise_vec4<T, 1, 4>(t, h, global_step, rows, grads, count, l, error, stream);
      default: return launch_rowwise_vec4<T, 2, 4>(t, h, global_step, rows, grads, count, l, error, stream);
    }
  }
  if (allow_vec4 && h.kind == OptimizerKind::kRowwiseAdagrad &&
      t.dim <= kRowwisePerLane * row_access::lanes_per_row(t.dim) && aligned(t.state, 16) &&
      t.state_stride_floats % 4 == 0) {
    const int lanes = row_access::lanes_per_row(t.dim);
    switch (row_access::rows_in_flight_for(count, lanes, l.max_blocks, l.rows_in_flight)) {
      case 1: return launch_rowwise<T, 1, kRowwisePerLane>(t, h, global_step, rows, grads, count, lanes, l, error, stream);
      case 2: return launch_rowwise<T, 2, kRowwisePerLane>(t, h, global_step, rows, grads, count, lanes, l, error, stream);
      default: return launch_rowwise<T, 4, kRowwisePerLane>(t, h, global_step, rows, grads, count, lanes, l, error, stream);
    }
  }
  // Row-wise kinds otherwise reduce over the row before updating it: the scalar kernel's two passes.
  if (allow_vec4 && !is_rowwise(h.kind) && t.dim % 4 == 0 && aligned(t.weights, wbytes) &&
      t.weight_stride_bytes % wbytes == 0 &&
      aligned(t.state, 16) && t.state_stride_floats % 4 == 0 && aligned(grads, 16)) {
    // At most 2 rows in flight: each holds up to 5 vectors of registers per lane, and Adam's step ran at 0.90 of
    // the duplex copy with 2, 0.70-0.84 with 4 (bench/RESULTS.md, issue 23).
    switch (row_access::rows_in_flight_for(count, row_access::lanes_per_row(t.dim / 4), l.max_blocks,
                                           std::min(l.rows_in_flight, 2))) {
      case 1: return launch_vec4<T, 1>(t, h, global_step, rows, grads, count, l.max_blocks, error, stream);
      default: return launch_vec4<T, 2>(t, h, global_step, rows, grads, count, l.max_blocks, error, stream);
    }
  }
  const int lanes = row_access::lanes_per_row(t.dim);
  row_optimizer_kernel<T><<<row_access::grid_for(count, lanes, l.max_blocks), kThreadsPerBlock, 0, stream>>>(
      t, h, global_step, rows, grads, count, lanes, error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void launch_row_optimizer(const OptimizerRows& table, const OptimizerHyper& hyper, int64_t global_step,
                          const int64_t* rows, const float* grads, int64_t count, const RowLaunch& launch,
                          bool allow_vec4, DeviceIndexError* error, cudaStream_t stream) {
  if (count == 0) return;
  switch (table.weight_type) {
    case WeightType::kFloat:
      return launch_typed<float>(table, hyper, global_step, rows, grads, count, launch, allow_vec4, error, stream);
    case WeightType::kHalf:
      return launch_typed<c10::Half>(table, hyper, global_step, rows, grads, count, launch, allow_vec4, error,
                                     stream);
    case WeightType::kBFloat16:
      return launch_typed<c10::BFloat16>(table, hyper, global_step, rows, grads, count, launch, allow_vec4, error,
                                         stream);
  }
}

}  // namespace speedtorch

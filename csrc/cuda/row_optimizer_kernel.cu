// Fused row optimizer kernel: one group of lanes per row reads the row's weights and state (over UVA when they
// live in pinned host memory), applies the optimizer (optim/row_optimizer_math.h) and writes both back, in one
// pass. The rows come sorted, so warps running together touch nearby host pages.
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

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

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    row_optimizer_kernel(OptimizerRows t, OptimizerHyper h, int64_t global_step, const int64_t* __restrict__ rows,
                         const float* __restrict__ grads, int64_t count, int lanes) {
  const RowLanes pos(lanes);
  for (int64_t i = pos.first_row; i < count; i += pos.stride_rows) {
    const int64_t row = rows[i];
    T* w = reinterpret_cast<T*>(t.weights + row * t.weight_stride_bytes);
    float* header = t.state + row * t.state_stride_floats;
    auto* step = reinterpret_cast<int32_t*>(header);
    const int32_t k = *step + 1;
    RowStep r = row_step(h, k, global_step);
    const float* g = grads + i * t.dim;
    float accumulator = 0.f;
    if (h.kind == OptimizerKind::kRowwiseAdagrad) {  // the row's mean squared gradient, before any element moves
      float part = 0.f;
      for (int64_t j = pos.lane; j < t.dim; j += lanes) {
        const float gj = decayed_gradient(h, static_cast<float>(w[j]), g[j]);
        part += gj * gj;
      }
      r.clr = rowwise_adagrad_scale(h, header[kRowwiseAccumulatorFloat], r.first, group_sum(part, pos, lanes), t.dim,
                                    &accumulator);
    }
    __syncwarp(pos.group_mask);  // every lane has read the header before lane 0 moves it on
    if (pos.lane == 0) {
      *step = k;
      if (h.kind == OptimizerKind::kRowwiseAdagrad) header[kRowwiseAccumulatorFloat] = accumulator;
    }
    float* s0 = header + kStateHeaderFloats;
    float* s1 = s0 + t.dim;
    float* s2 = s1 + t.dim;
    for (int64_t j = pos.lane; j < t.dim; j += lanes) {
      w[j] = rounded_weight<T>(h, update_element(h, r, static_cast<float>(w[j]), g[j], s0 + j, s1 + j, s2 + j),
                               global_step, row, j);
    }
  }
}

// The same update, four elements per lane with 16-byte state accesses (8-byte weight accesses for 16-bit tables),
// every load of a row issued before the first one is used: a row costs one round trip over PCIe instead of one per
// element group, so many more bytes are in flight. Needs dim % 4 == 0 and 16-byte aligned rows and state rows.
template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    row_optimizer_vec4_kernel(OptimizerRows t, OptimizerHyper h, int64_t global_step,
                              const int64_t* __restrict__ rows, const float* __restrict__ grads, int64_t count,
                              int lanes, int slots) {
  using WeightVector = typename row_access::Vector<4 * sizeof(T)>::type;
  const RowLanes pos(lanes);
  const int64_t vectors = t.dim / 4;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t i = pos.first_row; i < count; i += pos.stride_rows) {
    const int64_t row = rows[i];
    auto* w = reinterpret_cast<WeightVector*>(t.weights + row * t.weight_stride_bytes);
    float* header = t.state + row * t.state_stride_floats;
    auto* s0 = reinterpret_cast<float4*>(header + kStateHeaderFloats);
    auto* s1 = s0 + vectors;
    auto* s2 = s1 + vectors;
    const auto* g = reinterpret_cast<const float4*>(grads + i * t.dim);
    const int32_t k = *reinterpret_cast<const int32_t*>(header) + 1;
    for (int64_t v = pos.lane; v < vectors; v += lanes) {
      // Loads first (none depends on another), then the math, then the stores.
      const WeightVector wv = w[v];
      const float4 gv = g[v];
      float4 a = slots > 0 ? s0[v] : zero;
      float4 b = slots > 1 ? s1[v] : zero;
      float4 c = slots > 2 ? s2[v] : zero;
      const RowStep r = row_step(h, k, global_step);
      T wt[4];
      memcpy(wt, &wv, sizeof(wv));
      const float gs[4] = {gv.x, gv.y, gv.z, gv.w};
      float* as = &a.x;
      float* bs = &b.x;
      float* cs = &c.x;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        wt[e] = rounded_weight<T>(h, update_element(h, r, static_cast<float>(wt[e]), gs[e], as + e, bs + e, cs + e),
                                  global_step, row, 4 * v + e);
      }
      WeightVector out;
      memcpy(&out, wt, sizeof(out));
      w[v] = out;
      if (slots > 0) s0[v] = a;
      if (slots > 1) s1[v] = b;
      if (slots > 2) s2[v] = c;
    }
    __syncwarp(pos.group_mask);  // every lane has read the count before lane 0 moves it on
    if (pos.lane == 0) *reinterpret_cast<int32_t*>(header) = k;
  }
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <typename T>
void launch_typed(const OptimizerRows& t, const OptimizerHyper& h, int64_t global_step, const int64_t* rows,
                  const float* grads, int64_t count, int max_blocks, bool allow_vec4, cudaStream_t stream) {
  const int64_t wbytes = 4 * static_cast<int64_t>(sizeof(T));
  // Row-wise Adagrad reduces over the row before updating it: the scalar kernel's two passes.
  if (allow_vec4 && h.kind != OptimizerKind::kRowwiseAdagrad && t.dim % 4 == 0 && aligned(t.weights, wbytes) &&
      t.weight_stride_bytes % wbytes == 0 &&
      aligned(t.state, 16) && t.state_stride_floats % 4 == 0 && aligned(grads, 16)) {
    const int lanes = row_access::lanes_per_row(t.dim / 4);
    row_optimizer_vec4_kernel<T><<<row_access::grid_for(count, lanes, max_blocks), kThreadsPerBlock, 0, stream>>>(
        t, h, global_step, rows, grads, count, lanes, static_cast<int>(state_slots(h)));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const int lanes = row_access::lanes_per_row(t.dim);
  row_optimizer_kernel<T><<<row_access::grid_for(count, lanes, max_blocks), kThreadsPerBlock, 0, stream>>>(
      t, h, global_step, rows, grads, count, lanes);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void launch_row_optimizer(const OptimizerRows& table, const OptimizerHyper& hyper, int64_t global_step,
                          const int64_t* rows, const float* grads, int64_t count, int max_blocks, bool allow_vec4,
                          cudaStream_t stream) {
  if (count == 0) return;
  switch (table.weight_type) {
    case WeightType::kFloat: return launch_typed<float>(table, hyper, global_step, rows, grads, count, max_blocks,
                                                        allow_vec4, stream);
    case WeightType::kHalf: return launch_typed<c10::Half>(table, hyper, global_step, rows, grads, count, max_blocks,
                                                           allow_vec4, stream);
    case WeightType::kBFloat16:
      return launch_typed<c10::BFloat16>(table, hyper, global_step, rows, grads, count, max_blocks, allow_vec4,
                                                stream);
  }
}

}  // namespace speedtorch

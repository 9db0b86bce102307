// Fused row optimizer kernel: one group of lanes per row reads the row's weights and state (over UVA when they
// live in pinned host memory), applies the optimizer (optim/row_optimizer_math.h) and writes both back, in one
// pass. The rows come sorted, so warps running together touch nearby host pages.
#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "cuda/row_optimizer_kernel.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

using row_access::kThreadsPerBlock;

template <typename T>
__global__ void __launch_bounds__(kThreadsPerBlock)
    row_optimizer_kernel(OptimizerRows t, OptimizerHyper h, int64_t global_step, const int64_t* __restrict__ rows,
                         const float* __restrict__ grads, int64_t count, int lanes) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride_rows = static_cast<int64_t>(gridDim.x) * blockDim.x / lanes;
  const int lane = static_cast<int>(thread % lanes);
  const int warp_lane = static_cast<int>(threadIdx.x % 32);
  const unsigned group_mask =
      lanes == 32 ? 0xffffffffu : (((1u << lanes) - 1u) << (warp_lane / lanes * lanes));
  for (int64_t i = thread / lanes; i < count; i += stride_rows) {
    const int64_t row = rows[i];
    T* w = reinterpret_cast<T*>(t.weights + row * t.weight_stride_bytes);
    float* header = t.state + row * t.state_stride_floats;
    auto* step = reinterpret_cast<int32_t*>(header);
    const int32_t k = *step + 1;
    __syncwarp(group_mask);  // every lane has read the count before lane 0 moves it on
    if (lane == 0) *step = k;
    const RowStep r = row_step(h, k, global_step);
    float* s0 = header + kStateHeaderFloats;
    float* s1 = s0 + t.dim;
    float* s2 = s1 + t.dim;
    const float* g = grads + i * t.dim;
    for (int64_t j = lane; j < t.dim; j += lanes) {
      w[j] = static_cast<T>(update_element(h, r, static_cast<float>(w[j]), g[j], s0 + j, s1 + j, s2 + j));
    }
  }
}

template <typename T>
void launch_typed(const OptimizerRows& t, const OptimizerHyper& h, int64_t global_step, const int64_t* rows,
                  const float* grads, int64_t count, int max_blocks, cudaStream_t stream) {
  const int lanes = row_access::lanes_per_row(t.dim);
  row_optimizer_kernel<T><<<row_access::grid_for(count, lanes, max_blocks), kThreadsPerBlock, 0, stream>>>(
      t, h, global_step, rows, grads, count, lanes);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void launch_row_optimizer(const OptimizerRows& table, const OptimizerHyper& hyper, int64_t global_step,
                          const int64_t* rows, const float* grads, int64_t count, int max_blocks,
                          cudaStream_t stream) {
  if (count == 0) return;
  switch (table.weight_type) {
    case WeightType::kFloat: return launch_typed<float>(table, hyper, global_step, rows, grads, count, max_blocks,
                                                        stream);
    case WeightType::kHalf: return launch_typed<c10::Half>(table, hyper, global_step, rows, grads, count, max_blocks,
                                                           stream);
    case WeightType::kBFloat16:
      return launch_typed<c10::BFloat16>(table, hyper, global_step, rows, grads, count, max_blocks, stream);
  }
}

}  // namespace speedtorch

// Launcher of the fused row optimizer kernel: updates rows[0..count) (distinct, valid, device memory) of a table
// whose rows and state the GPU can address (device memory or mapped pinned host memory, UVA) with the summed
// gradients `grads` (count x dim float32, device memory). Asynchronous on `stream`. allow_vec4: use the vectorized
// kernel where the rows' alignment permits (TransferConfig::optimizer_vec4; false forces the scalar kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/row_optimizer_math.h"

namespace speedtorch {

void launch_row_optimizer(const OptimizerRows& table, const OptimizerHyper& hyper, int64_t global_step,
                          const int64_t* rows, const float* grads, int64_t count, int max_blocks, bool allow_vec4,
                          cudaStream_t stream);

}  // namespace speedtorch

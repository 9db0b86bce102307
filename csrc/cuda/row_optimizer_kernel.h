// Launcher of the fused row optimizer kernel: updates rows[0..count) (distinct, device memory) of a table whose
// rows and state the GPU can address (device memory or mapped pinned host memory, UVA) with the summed gradients
// `grads` (count x dim float32, device memory). Asynchronous on `stream`. allow_vec4: use the vectorized kernel
// where the rows' alignment permits (TransferConfig::optimizer_vec4; false forces the scalar kernel). An id outside
// the table is flagged in `error` and its row left alone; launch.rows_in_flight above 4 (2 for the
// vectorized kernel) counts as 4 (2).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/row_kernels.h"
#include "core/row_optimizer_math.h"

namespace speedtorch {

void launch_row_optimizer(const OptimizerRows& table, const OptimizerHyper& hyper, int64_t global_step,
                          const int64_t* rows, const float* grads, int64_t count, const RowLaunch& launch,
                          bool allow_vec4, DeviceIndexError* error, cudaStream_t stream);

}  // namespace speedtorch

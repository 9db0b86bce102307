// The GPU routes of the fused row optimizer (see row_optimizer.h). Arguments are checked; indices flat; grad 2-D.
#pragma once

#include <ATen/core/Tensor.h>

#include "core/row_optimizer_math.h"

namespace speedtorch {

void apply_row_optimizer_cuda(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& indices,
                              const at::Tensor& grad, const OptimizerHyper& hyper, int64_t global_step,
                              const char* op, bool sorted_unique,
                              const std::optional<at::Tensor>& updated_rows = std::nullopt);

}  // namespace speedtorch

// The fused row optimizer on CPU threads: updates the rows `rows[0..count)` (distinct, valid) of a host table and
// their state in place with the summed gradients `grads` (count x dim float32, dense).
#pragma once

#include <cstdint>

#include "core/row_optimizer_math.h"

namespace speedtorch {

void apply_row_optimizer_cpu(const OptimizerRows& table, const OptimizerHyper& hyper, int64_t global_step,
                             const int64_t* rows, const float* grads, int64_t count);

}  // namespace speedtorch

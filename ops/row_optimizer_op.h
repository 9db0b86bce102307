// speedtorch::row_optimizer_step_: one fused optimizer step on the rows a batch touched (csrc/optim). The kernel
// is registered for CPU and CUDA (a pinned host table with CUDA gradients dispatches to CUDA), and a Meta kernel
// checks shapes.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <string>

namespace speedtorch::ops {

// The C++ entry point through the dispatcher.
void row_optimizer_step_(at::Tensor& weights, at::Tensor& state, const at::Tensor& indices, const at::Tensor& grad,
                         const std::string& optimizer, const c10::Dict<std::string, double>& options, int64_t step,
                         bool sorted_unique = false);

void row_optimizer_step_kernel(at::Tensor& weights, at::Tensor& state, const at::Tensor& indices,
                               const at::Tensor& grad, c10::string_view optimizer,
                               const c10::Dict<std::string, double>& options, int64_t step, bool sorted_unique);
void row_optimizer_step_meta(at::Tensor& weights, at::Tensor& state, const at::Tensor& indices,
                             const at::Tensor& grad, c10::string_view optimizer,
                             const c10::Dict<std::string, double>& options, int64_t step, bool sorted_unique);

}  // namespace speedtorch::ops

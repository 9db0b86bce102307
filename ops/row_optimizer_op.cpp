// speedtorch::row_optimizer_step_: entry point and kernels (see row_optimizer_op.h).
#include "row_optimizer_op.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "optim/optimizer_config.h"
#include "optim/row_optimizer.h"

namespace speedtorch::ops {
namespace {
constexpr const char* kOp = "speedtorch.row_optimizer_step_";
}  // namespace

void row_optimizer_step_(at::Tensor& weights, at::Tensor& state, const at::Tensor& indices, const at::Tensor& grad,
                         const std::string& optimizer, const c10::Dict<std::string, double>& options, int64_t step,
                         bool sorted_unique) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("speedtorch::row_optimizer_step_", "")
                       .typed<void(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view,
                                   const c10::Dict<std::string, double>&, int64_t, bool)>();
  op.call(weights, state, indices, grad, optimizer, options, step, sorted_unique);
}

void row_optimizer_step_kernel(at::Tensor& weights, at::Tensor& state, const at::Tensor& indices,
                               const at::Tensor& grad, c10::string_view optimizer,
                               const c10::Dict<std::string, double>& options, int64_t step, bool sorted_unique) {
  const OptimizerHyper hyper = parse_optimizer(std::string(optimizer), options);
  apply_row_optimizer(weights, state, indices, grad, hyper, step, kOp, sorted_unique);
}

void row_optimizer_step_meta(at::Tensor& weights, at::Tensor& state, const at::Tensor& indices,
                             const at::Tensor& grad, c10::string_view optimizer,
                             const c10::Dict<std::string, double>& options, int64_t step,
                             bool /*sorted_unique: checked against the values, which Meta tensors do not have*/) {
  const OptimizerHyper hyper = parse_optimizer(std::string(optimizer), options);
  check_row_optimizer_arguments(weights, state, indices, grad, hyper, step, kOp);
}

}  // namespace speedtorch::ops

// Autograd for gather, in C++ so a model loaded by torch::jit::load trains with no Python in the process.
//
// The gradient of the table is dense (num_rows x dim): right for gradcheck and small tables (HostEmbedding's CPU
// forward spreads its distinct rows over the batch's positions with it). Large tables train
// through PinnedEmbedding's fused optimizer, which never forms it. scatter_ is not differentiable.
#include <torch/autograd.h>
#include <torch/library.h>

#include "cpu/index_range_check.h"
#include "cpu/row_sum_cpu.h"
#include "cpu/table_views.h"
#include "row_ops.h"

namespace speedtorch::ops {
namespace {

// The dense float32 gradient of a CPU table of `num_rows` rows: each row the sum of the rows of `grad` (indices.numel()
// x D) whose index names it. The indices were checked by the forward gather; checked again here (one pass), as
// nothing may write out of bounds.
at::Tensor sum_rows_by_index(const at::Tensor& indices, const at::Tensor& grad, int64_t num_rows) {
  const at::Tensor idx = indices.reshape({-1}).to(at::kCPU).contiguous();
  check_index_tensor(idx, num_rows, "speedtorch.gather (backward)");
  const at::Tensor src = grad.to(at::kCPU, at::kFloat).contiguous();
  at::Tensor out = at::empty({num_rows, src.size(1)}, src.options());
  with_index_type(idx, [&](const auto* p) {
    sum_rows_by_index_cpu(p, idx.numel(), src.const_data_ptr<float>(), src.size(1), out.data_ptr<float>(), num_rows);
  });
  return out;
}

class GatherFunction : public torch::autograd::Function<GatherFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& table, const at::Tensor& indices,
                            std::optional<at::Device> device) {
    ctx->save_for_backward({indices});
    ctx->saved_data["num_rows"] = table.size(0);
    ctx->saved_data["table_dtype"] = table.scalar_type();
    ctx->saved_data["table_device"] = table.device();
    at::AutoDispatchBelowADInplaceOrView guard;
    return gather(table, indices, device);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor indices = ctx->get_saved_variables()[0];
    const auto options = at::TensorOptions()
                             .dtype(ctx->saved_data["table_dtype"].toScalarType())
                             .device(ctx->saved_data["table_device"].toDevice());
    const int64_t num_rows = ctx->saved_data["num_rows"].toInt();
    const at::Tensor& grad = grads[0];
    const int64_t dim = grad.size(-1);
    if (options.device().is_cpu() && options.dtype() == at::kFloat) {
      // What index_add_ into zeros gives, bit for bit, without waking threads for a small batch (cpu/row_sum_cpu.h).
      return {sum_rows_by_index(indices, grad.reshape({indices.numel(), dim}), num_rows), at::Tensor(), at::Tensor()};
    }
    at::Tensor grad_table = at::zeros({num_rows, dim}, options);
    grad_table.index_add_(0, indices.reshape({-1}).to(options.device(), at::kLong),
                          // By row count, not -1: a 0-element gradient (rows of width 0) cannot resolve -1.
                          grad.reshape({indices.numel(), dim}).to(options.device(), options.dtype().toScalarType()));
    return {grad_table, at::Tensor(), at::Tensor()};
  }
};

at::Tensor gather_autograd(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device) {
  if (!at::GradMode::is_enabled() || !table.requires_grad()) {
    // Nothing to differentiate: straight to the kernel. Function::apply would still build a graph node and its
    // saved data (a third of a small gather's time).
    at::AutoDispatchBelowADInplaceOrView guard;
    return gather(table, indices, device);
  }
  return GatherFunction::apply(table, indices, device);
}

}  // namespace
}  // namespace speedtorch::ops

TORCH_LIBRARY_IMPL(speedtorch, Autograd, m) {
  m.impl("gather", &speedtorch::ops::gather_autograd);
}

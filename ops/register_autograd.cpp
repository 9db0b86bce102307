// Autograd for gather, in C++ so a model loaded by torch::jit::load trains with no Python in the process.
//
// The gradient of the table is dense (num_rows x dim): right for gradcheck and small tables. Large tables train
// through PinnedEmbedding's fused optimizer, which never forms it. scatter_ is not differentiable.
#include <torch/autograd.h>
#include <torch/library.h>

#include "row_ops.h"

namespace speedtorch::ops {
namespace {

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
    at::Tensor grad_table = at::zeros({num_rows, dim}, options);
    grad_table.index_add_(0, indices.reshape({-1}).to(options.device(), at::kLong),
                          // By row count, not -1: a 0-element gradient (rows of width 0) cannot resolve -1.
                          grad.reshape({indices.numel(), dim}).to(options.device(), options.dtype().toScalarType()));
    return {grad_table, at::Tensor(), at::Tensor()};
  }
};

at::Tensor gather_autograd(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device) {
  return GatherFunction::apply(table, indices, device);
}

}  // namespace
}  // namespace speedtorch::ops

TORCH_LIBRARY_IMPL(speedtorch, Autograd, m) {
  m.impl("gather", &speedtorch::ops::gather_autograd);
}

// Typed dispatcher entry points of the row operators (see row_ops.h).
#include "row_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace speedtorch::ops {

at::Tensor gather(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("speedtorch::gather", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, std::optional<at::Device>)>();
  return op.call(table, indices, device);
}

at::Tensor& scatter_(at::Tensor& table, const at::Tensor& indices, const at::Tensor& src) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("speedtorch::scatter_", "")
                       .typed<at::Tensor&(at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(table, indices, src);
}

void scatter_rows_(at::Tensor& table, const at::Tensor& indices, const at::Tensor& src) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("speedtorch::scatter_rows_", "")
                       .typed<void(at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  op.call(table, indices, src);
}

}  // namespace speedtorch::ops

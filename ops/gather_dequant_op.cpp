// speedtorch::gather_dequant: entry point and kernels (see gather_dequant_op.h).
#include "gather_dequant_op.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>

#include "quant/gather_dequant.h"

namespace speedtorch::ops {
namespace {
constexpr const char* kOp = "speedtorch.gather_dequant";
}  // namespace

at::Tensor gather_dequant(const at::Tensor& table, const at::Tensor& indices, const std::string& format, int64_t dim,
                          std::optional<at::Device> device) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("speedtorch::gather_dequant", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t,
                                         std::optional<at::Device>)>();
  return op.call(table, indices, format, dim, device);
}

at::Tensor gather_dequant_kernel(const at::Tensor& table, const at::Tensor& indices, c10::string_view format,
                                 int64_t dim, std::optional<at::Device> device) {
  return speedtorch::gather_dequant(table, indices, std::string(format), dim, device, kOp);
}

at::Tensor gather_dequant_meta(const at::Tensor& table, const at::Tensor& indices, c10::string_view format,
                               int64_t dim, std::optional<at::Device> device) {
  check_gather_dequant_arguments(table, indices, std::string(format), dim, kOp);
  (void)device;  // a meta tensor has no other device: python/speedtorch/_fake.py puts the rows where asked
  std::vector<c10::SymInt> shape(indices.sym_sizes().begin(), indices.sym_sizes().end());
  shape.push_back(dim);
  return at::empty_symint(shape, at::TensorOptions().dtype(at::kBFloat16).device(at::kMeta));
}

void check_gather_dequant_arguments_kernel(const at::Tensor& table, const at::Tensor& indices,
                                           c10::string_view format, int64_t dim) {
  check_gather_dequant_arguments(table, indices, std::string(format), dim, kOp);
}

}  // namespace speedtorch::ops

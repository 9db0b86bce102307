// Backend kernels of gather / scatter_ as the dispatcher sees them: csrc/transfer/checked_row_transfer.h under the
// operators' names (see row_ops_kernel.h).
#include "row_ops_kernel.h"

#include <ATen/ops/empty.h>

#include "transfer/checked_row_transfer.h"

namespace speedtorch::ops {
namespace {

constexpr const char* kGather = "speedtorch.gather";
constexpr const char* kScatter = "speedtorch.scatter_";

}  // namespace

void check_gather_arguments_kernel(const at::Tensor& table, const at::Tensor& indices) {
  check_gather_arguments(table, indices, kGather);
}

at::Tensor gather_meta(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device) {
  check_gather_arguments(table, indices, kGather);
  (void)device;  // a meta tensor has no other device: python/speedtorch/_fake.py puts the rows where asked
  return at::empty_symint(gathered_sym_shape(indices, table), table.options().device(at::kMeta));
}

void scatter_meta(at::Tensor& table, const at::Tensor& indices, const at::Tensor& src) {
  check_scatter_arguments(table, indices, src, kScatter);
}

at::Tensor gather_kernel(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device) {
  return gather_table_rows(table, indices, device, kGather);
}

void scatter_kernel(at::Tensor& table, const at::Tensor& indices, const at::Tensor& src) {
  scatter_table_rows(table, indices, src, kScatter);
}

}  // namespace speedtorch::ops

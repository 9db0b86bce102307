// scatter_ as a composite of scatter_rows_: same work, but it returns the table, as an in-place op should. And
// check_gather_arguments and check_gather_dequant_arguments, which read metadata only (any tensor, fake or symbolic,
// goes through them as it is).
#include <torch/library.h>

#include "gather_dequant_op.h"
#include "row_ops.h"
#include "row_ops_kernel.h"

namespace speedtorch::ops {
namespace {

at::Tensor& scatter_composite(at::Tensor& table, const at::Tensor& indices, const at::Tensor& src) {
  scatter_rows_(table, indices, src);
  return table;
}

}  // namespace
}  // namespace speedtorch::ops

TORCH_LIBRARY_IMPL(speedtorch, CompositeImplicitAutograd, m) {
  m.impl("scatter_", &speedtorch::ops::scatter_composite);
  m.impl("check_gather_arguments", &speedtorch::ops::check_gather_arguments_kernel);
  m.impl("check_gather_dequant_arguments", &speedtorch::ops::check_gather_dequant_arguments_kernel);
}

// scatter_ as a composite of scatter_rows_: same work, but it returns the table, as an in-place op should.
#include <torch/library.h>

#include "row_ops.h"

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
}

// speedtorch::unique_indices: torch.unique(indices, sorted=True, return_inverse=True) for row ids, the step every
// HostEmbedding forward starts with. CPU indices: one hash pass on the calling thread and a sort of the distinct
// values only (csrc/cpu/distinct_indices_cpu.h), 4x faster than torch's for a demo batch; the same values. Indices on
// a GPU: torch's unique. Under torch.compile the outputs' sizes depend on the data: the fake kernel is in
// python/speedtorch/_fake.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "cpu/distinct_indices_cpu.h"
#include "cpu/table_views.h"

namespace speedtorch::ops {
namespace {

std::tuple<at::Tensor, at::Tensor> unique_indices(const at::Tensor& indices) {
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt,
              "speedtorch.unique_indices: indices must be int64 or int32, got ", indices.scalar_type());
  if (!indices.is_cpu()) {
    auto [unique, inverse, counts] = at::_unique2(indices, /*sorted=*/true, /*return_inverse=*/true);
    return {unique, inverse};
  }
  const at::Tensor idx = indices.contiguous();
  const int64_t count = idx.numel();
  at::Tensor distinct = at::empty({count}, idx.options().dtype(at::kLong));
  at::Tensor inverse = at::empty(idx.sizes(), idx.options().dtype(at::kLong));
  int64_t n = 0;
  with_index_type(idx, [&](const auto* p) {
    n = distinct_indices_cpu(p, count, distinct.data_ptr<int64_t>(), inverse.data_ptr<int64_t>());
  });
  distinct.resize_({n});  // torch.unique's values have the indices' dtype
  return {distinct.to(indices.scalar_type()), inverse};
}

}  // namespace
}  // namespace speedtorch::ops

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  // The distinct values of `indices` (int32/int64, any shape, any device) ascending, in their dtype, and for each
  // element the place of its value among them (int64, the indices' shape): torch.unique(indices, sorted=True,
  // return_inverse=True).
  m.def("unique_indices(Tensor indices) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(speedtorch, CompositeExplicitAutograd, m) {
  m.impl("unique_indices", &speedtorch::ops::unique_indices);
}

// speedtorch::check_indices: the library's one rule for row indices (csrc/cpu/index_range_check.h) as an operator,
// for code outside the row operators that checks ids itself (python/speedtorch: the placements' hot rows and
// splits, the distributed table's lookups), so every index error is decided and worded in one place.
#include <torch/library.h>

#include <string>

#include "cpu/index_range_check.h"

namespace speedtorch::ops {
namespace {

// Raises IndexError naming `op`, `arg`, the value and its flat position when an index is outside [0, num_rows).
void check_indices_op(const at::Tensor& indices, int64_t num_rows, c10::string_view op, c10::string_view arg) {
  check_index_tensor_on_any_device(indices, num_rows, std::string(op).c_str(), std::string(arg).c_str());
}

}  // namespace
}  // namespace speedtorch::ops

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  m.def("check_indices(Tensor indices, int num_rows, str op, str arg=\"indices\") -> ()",
        &speedtorch::ops::check_indices_op);
}

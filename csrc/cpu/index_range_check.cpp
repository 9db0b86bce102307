// Host-side index validation (see index_range_check.h).
#include "cpu/index_range_check.h"

#include <ATen/ops/aminmax.h>
#include <ATen/ops/stack.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/helped_parallel_for.h"
#include "cpu/table_views.h"

namespace speedtorch {
namespace {

struct Scan {
  IndexSpan span;
  int64_t first_bad = -1;  // smallest position holding an out-of-range index
};

// The span in one pass of two running extremes (no branch per index), on the calling thread for a small batch,
// with helper threads that join when they run for a large one (cpu/helped_parallel_for.h: every transfer with CPU
// indices checks them here first, and an OpenMP region would wait a scheduling period for a thread not running;
// cpu/row_copy_cpu.cpp, issue 30); the first bad position, in a second pass, only when the span leaves
// [0, num_rows) (the smallest position, so messages are deterministic).
template <typename Index>
Scan scan_indices(const Index* indices, int64_t count, int64_t num_rows) {
  Scan total;
  if (count == 0) return total;
  total.span.min = INT64_MAX;
  total.span.max = INT64_MIN;
  std::mutex mutex;
  helped_parallel_for(count, 1 << 16, [&](int64_t begin, int64_t end) {
    int64_t lo = INT64_MAX;
    int64_t hi = INT64_MIN;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t v = static_cast<int64_t>(indices[i]);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    std::lock_guard<std::mutex> lock(mutex);
    total.span.min = std::min(total.span.min, lo);
    total.span.max = std::max(total.span.max, hi);
  });
  if (total.span.min < 0 || total.span.max >= num_rows) {
    for (int64_t i = 0; i < count && total.first_bad < 0; ++i) {
      const int64_t v = static_cast<int64_t>(indices[i]);
      if (v < 0 || v >= num_rows) total.first_bad = i;
    }
  }
  return total;
}

}  // namespace

template <typename Index>
IndexRangeViolation find_index_out_of_range(const Index* indices, int64_t count, int64_t num_rows) {
  const Scan scan = scan_indices(indices, count, num_rows);
  IndexRangeViolation result;
  if (scan.first_bad >= 0) {
    result.found = true;
    result.position = scan.first_bad;
    result.value = static_cast<int64_t>(indices[scan.first_bad]);
  }
  return result;
}

namespace {

// " (arg[i, j])": the element at flat `position` of a tensor of `shape`, for shapes of more than one dimension.
std::string element_at(const char* arg, at::IntArrayRef shape, int64_t position) {
  if (shape.size() < 2) return "";
  std::vector<int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = position % shape[d];
    position /= shape[d];
  }
  return c10::str(" (", arg, at::IntArrayRef(index), ")");
}

}  // namespace

template <typename Index>
IndexSpan check_indices_in_range(const Index* indices, int64_t count, int64_t num_rows, const char* op,
                                 const char* arg, at::IntArrayRef shape) {
  const Scan scan = scan_indices(indices, count, num_rows);
  TORCH_CHECK_INDEX(scan.first_bad < 0, op, ": ", arg, " holds ", static_cast<int64_t>(indices[scan.first_bad]),
                    " at flat position ", scan.first_bad, element_at(arg, shape, scan.first_bad),
                    "; every index must be in [0, ", num_rows, ") for a table of ", num_rows,
                    " rows (negative indices are not wrapped)");
  return scan.span;
}

IndexSpan check_index_tensor(const at::Tensor& host_indices, int64_t num_rows, const char* op, const char* arg) {
  TORCH_CHECK(host_indices.is_cpu(), op, ": internal error: indices must be on the host here, got ",
              host_indices.device());
  const at::Tensor idx = host_indices.contiguous();
  IndexSpan span;
  with_index_type(idx, [&](const auto* p) {
    span = check_indices_in_range(p, idx.numel(), num_rows, op, arg, idx.sizes());
  });
  return span;
}

IndexSpan check_index_tensor_on_any_device(const at::Tensor& indices, int64_t num_rows, const char* op,
                                           const char* arg) {
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, op, ": ", arg,
              " must be int64 or int32, got ", indices.scalar_type());
  if (indices.is_cpu()) return check_index_tensor(indices, num_rows, op, arg);
  if (indices.numel() == 0) return IndexSpan{};
  const auto [lo, hi] = at::aminmax(indices);
  const at::Tensor ends = at::stack({lo.to(at::kLong), hi.to(at::kLong)}).cpu();
  const IndexSpan span{ends[0].item<int64_t>(), ends[1].item<int64_t>()};
  if (span.min < 0 || span.max >= num_rows) check_index_tensor(indices.cpu(), num_rows, op, arg);  // throws
  return span;
}

IndexSpan check_sorted_unique_index_tensor(const at::Tensor& host_indices, int64_t num_rows, const char* op) {
  TORCH_CHECK(host_indices.is_cpu(), op, ": internal error: indices must be on the host here, got ",
              host_indices.device());
  const at::Tensor idx = host_indices.contiguous();
  const int64_t count = idx.numel();
  if (count == 0) return IndexSpan{};
  IndexSpan span;
  with_index_type(idx, [&](const auto* p) {
    // Serial: one compare per index is cheaper than waking a second thread for the batches this is used on.
    for (int64_t i = 1; i < count; ++i) {
      TORCH_CHECK_VALUE(p[i] > p[i - 1], op, ": indices were passed as sorted and unique (sorted_unique=True) but ",
                        "position ", i, " holds ", static_cast<int64_t>(p[i]), " after ", static_cast<int64_t>(p[i - 1]),
                        "; nothing was updated. Pass sorted_unique=False (duplicates' gradients are then summed), "
                        "or the output of torch.unique(ids, sorted=True)");
    }
    // Increasing: the first and the last index bound all of them.
    const int64_t first = static_cast<int64_t>(p[0]);
    const int64_t last = static_cast<int64_t>(p[count - 1]);
    if (first < 0 || last >= num_rows) check_indices_in_range(p, count, num_rows, op, "indices");  // throws
    span = IndexSpan{first, last};
  });
  return span;
}

template IndexRangeViolation find_index_out_of_range<int32_t>(const int32_t*, int64_t, int64_t);
template IndexRangeViolation find_index_out_of_range<int64_t>(const int64_t*, int64_t, int64_t);
template IndexSpan check_indices_in_range<int32_t>(const int32_t*, int64_t, int64_t, const char*, const char*,
                                                   at::IntArrayRef);
template IndexSpan check_indices_in_range<int64_t>(const int64_t*, int64_t, int64_t, const char*, const char*,
                                                   at::IntArrayRef);

}  // namespace speedtorch

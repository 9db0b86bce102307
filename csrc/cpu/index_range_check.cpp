// Host-side index validation (see index_range_check.h).
#include "cpu/index_range_check.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <atomic>

namespace speedtorch {

template <typename Index>
IndexRangeViolation find_index_out_of_range(const Index* indices, int64_t count, int64_t num_rows) {
  // Each chunk reports its first bad position; the smallest wins so the message is deterministic.
  std::atomic<int64_t> first_bad{count};
  at::parallel_for(0, count, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t v = static_cast<int64_t>(indices[i]);
      if (v < 0 || v >= num_rows) {
        int64_t cur = first_bad.load();
        while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
        }
        return;
      }
    }
  });
  IndexRangeViolation result;
  const int64_t pos = first_bad.load();
  if (pos < count) {
    result.found = true;
    result.position = pos;
    result.value = static_cast<int64_t>(indices[pos]);
  }
  return result;
}

template <typename Index>
void check_indices_in_range(const Index* indices, int64_t count, int64_t num_rows, const char* op, const char* arg) {
  const IndexRangeViolation bad = find_index_out_of_range(indices, count, num_rows);
  TORCH_CHECK_INDEX(!bad.found, op, ": ", arg, " holds ", bad.value, " at flat position ", bad.position,
                    "; every index must be in [0, ", num_rows, ") for a table of ", num_rows,
                    " rows (negative indices are not wrapped)");
}

template IndexRangeViolation find_index_out_of_range<int32_t>(const int32_t*, int64_t, int64_t);
template IndexRangeViolation find_index_out_of_range<int64_t>(const int64_t*, int64_t, int64_t);
template void check_indices_in_range<int32_t>(const int32_t*, int64_t, int64_t, const char*, const char*);
template void check_indices_in_range<int64_t>(const int64_t*, int64_t, int64_t, const char*, const char*);

}  // namespace speedtorch

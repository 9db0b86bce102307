// Host-side validation of row indices: every index must lie in [0, num_rows).
//
// Done before any row is touched, so a bad index is reported with its value and position and never reads or writes
// out of bounds. Parallel over the indices (at::parallel_for); one pass, no allocation.
#pragma once

#include <cstdint>

namespace speedtorch {

struct IndexRangeViolation {
  bool found = false;
  int64_t position = -1;  // smallest flat position holding a bad index
  int64_t value = 0;
};

template <typename Index>
IndexRangeViolation find_index_out_of_range(const Index* indices, int64_t count, int64_t num_rows);

// Smallest and largest index of a batch: how much of the table it touches (its footprint).
struct IndexSpan {
  int64_t min = 0;
  int64_t max = -1;  // max < min: no indices
};

// Throws c10::IndexError naming `op` and `arg` when an index is out of range; returns the batch's span otherwise.
template <typename Index>
IndexSpan check_indices_in_range(const Index* indices, int64_t count, int64_t num_rows, const char* op,
                                 const char* arg);

}  // namespace speedtorch

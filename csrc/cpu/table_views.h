// How the row routes see their tensors: a 2-D table as raw host rows, and an index tensor as a typed pointer.
//
// One definition for the CPU routes (transfer/row_transfer.cpp), the GPU routes (transfer/row_transfer_cuda.cpp) and
// index validation (index_range_check.cpp), so that the row stride and the index types accepted cannot drift apart.
#pragma once

#include <ATen/core/Tensor.h>

#include "cpu/row_copy_cpu.h"

namespace speedtorch {

// The rows of a 2-D table (host memory) as the CPU row copies take them.
inline HostRows host_rows(const at::Tensor& table) {
  return HostRows{static_cast<char*>(table.data_ptr()), table.size(0), table.stride(0) * table.element_size(),
                  table.size(1) * table.element_size()};
}

// Calls fn with the indices' data as const int64_t* or const int32_t* (the two index types the ops accept; the
// schemas check the type before any route runs).
template <typename Fn>
void with_index_type(const at::Tensor& indices, Fn&& fn) {
  if (indices.scalar_type() == at::kLong) {
    fn(indices.const_data_ptr<int64_t>());
  } else {
    fn(indices.const_data_ptr<int32_t>());
  }
}

}  // namespace speedtorch

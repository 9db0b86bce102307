// Tensor-level row transfer between a table and a dense block of rows, whatever the devices: the one place that
// decides which path serves a call.
//
//   table on CPU,  rows on CPU   -> CPU threads (cpu/row_copy_cpu.h)
//   table pinned,  rows on a GPU -> transfer engine: UVA kernel and staged CPU copies, split per call
//   table on GPU,  rows on that GPU -> GPU kernel over device memory
//
// Callers (the operator layer) have validated shapes and dtypes; these functions validate index values.
// `indices` is flat (numel == rows), int32 or int64, contiguous, on any device. `out` / `src` is (rows, D),
// contiguous, of the table's dtype. `op` names the operator in error messages.
#pragma once

#include <ATen/core/Tensor.h>

namespace speedtorch {

// out[i] = table[indices[i]]. The table's device and out's device must be the same, or the table pinned host
// memory and out on a GPU.
void gather_rows(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op);

// table[indices[i]] = src[i]; duplicate indices: the last occurrence wins. The table's device and src's device must
// be the same, or the table pinned host memory and src on a GPU.
void scatter_rows(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op);

}  // namespace speedtorch

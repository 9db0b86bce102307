// speedtorch::gather_dequant on tensors: argument checks with messages a user can act on, output allocation, and
// the route (CPU loop, fused GPU kernel over UVA or device memory, or the staged path for a pageable table).
// Row layouts: core/row_formats.h. `op` names the caller in error messages.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <string>
#include <vector>

#include "core/row_formats.h"

namespace speedtorch {

// The format named "bf16", "int8_rowwise" or "fp8_e4m3_ue8m0"; an error listing them otherwise.
RowFormat parse_row_format(const std::string& name, const char* op);

// Rows of `table` for `indices` (int32/int64, any shape), dequantized to bfloat16, shaped indices.shape + (dim,), on
// `device` if given, else on the indices' device:
// - a table on the CPU with the rows going to the CPU: CPU threads;
// - a pinned host table (or a GPU table) with the rows going to a GPU: one GPU kernel that reads the rows over UVA
//   (indices sorted by row first when the batch is large and spread, as gather does) and dequantizes them;
// - a pageable host table (a file mapped without page-locking, larger than RAM) with the rows going to a GPU: CPU
//   threads read the raw rows (page faults read them from disk) into pinned staging, the copy engine moves them,
//   and the same kernel dequantizes them on the GPU. Not under CUDA graph capture.
// Indices are validated as gather validates them (deferred checks and capture: the kernel flags bad ones).
at::Tensor gather_dequant(const at::Tensor& table, const at::Tensor& indices, const std::string& format, int64_t dim,
                          std::optional<at::Device> device, const char* op);

// The checks that need no data (the Meta kernel's); returns the format.
RowFormat check_gather_dequant_arguments(const at::Tensor& table, const at::Tensor& indices,
                                         const std::string& format, int64_t dim, const char* op);

#ifdef SPEEDTORCH_WITH_CUDA
// The GPU routes (gather_dequant_cuda.cpp): `table` is pinned host memory or on out's GPU; `flat` is 1-D.
void gather_dequant_to_cuda(const at::Tensor& table, const at::Tensor& flat, RowFormat format, int64_t dim,
                            at::Tensor& out, const char* op);
#endif

}  // namespace speedtorch

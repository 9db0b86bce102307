// The GPU routes of row_transfer.h: the host<->GPU transfer engine and device-resident tables.
#pragma once

#include <ATen/core/Tensor.h>

namespace speedtorch {

// Pinned host table -> rows on a GPU: a UVA kernel for one share of the rows, CPU threads and the copy engine for
// the rest (transfer/transfer_policy.h), concurrently.
void gather_pinned_to_cuda(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op);
// Rows on a GPU -> pinned host table, split the same way; duplicate indices resolved on the GPU (last wins).
void scatter_cuda_to_pinned(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                            const char* op);

// Table and rows on the same GPU.
void gather_cuda_table(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op);
void scatter_cuda_table(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op);

}  // namespace speedtorch

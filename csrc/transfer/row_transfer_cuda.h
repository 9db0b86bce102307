// The GPU routes of row_transfer.h: the host<->GPU transfer engine and device-resident tables.
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>

#include "cuda/row_kernels.h"
#include "transfer/transfer_policy.h"

namespace speedtorch {

// The UVA share of a transfer (the first `count` entries of `dev_idx`) as the kernels take it: sorted by table
// bucket, with each entry's batch position, when the rows touched (`footprint` bytes of the table) span more than
// the GPU translates quickly, the batch is large and not `sorted` already (config.sort_uva_indices); as given
// otherwise. The tensors hold
// the sorted copies for as long as the kernel that reads `view` is queued.
struct UvaShare {
  at::Tensor sorted;
  at::Tensor positions;
  GpuIndices view;
};
UvaShare uva_share(const at::Tensor& dev_idx, int64_t count, const at::Tensor& table, int64_t footprint,
                   bool sorted, const TransferConfig& config, int device, cudaStream_t stream);

// Pinned host table -> rows on a GPU: a UVA kernel for one share of the rows, CPU threads and the copy engine for
// the rest (transfer/transfer_policy.h), concurrently. A pageable host table (a file mapped without page-locking,
// e.g. one larger than RAM) goes all through the CPU threads and the copy engine (not under CUDA graph capture).
void gather_pinned_to_cuda(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op);
// Rows on a GPU -> pinned host table, split the same way; duplicate indices resolved on the GPU (last wins).
void scatter_cuda_to_pinned(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                            const char* op);

// Table and rows on the same GPU.
void gather_cuda_table(const at::Tensor& table, const at::Tensor& indices, at::Tensor& out, const char* op);
void scatter_cuda_table(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op);

}  // namespace speedtorch

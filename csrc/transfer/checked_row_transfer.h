// Gather and scatter of a table's rows as speedtorch::gather / scatter_ define them, on tensors: argument checks
// with messages a user can act on, output allocation and placement, then row_transfer.h picks the path. The
// operator layer (ops/row_ops_kernel.cpp) registers these; PinnedEmbedding calls them directly, under its own lock,
// without going back through the dispatcher. `op` names the caller in error messages.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <vector>

namespace speedtorch {

// Rows of `table` (2-D, rows contiguous) for `indices` (int32/int64, any shape), shaped indices.shape + (dim,), on
// `device` if given, else on the indices' device ('cuda' without an index: the indices' GPU, else GPU 0).
at::Tensor gather_table_rows(const at::Tensor& table, const at::Tensor& indices, std::optional<at::Device> device,
                             const char* op);

// table[indices[i]] = src[i] (src: indices.shape + (dim,), the table's dtype); duplicates: the last one wins. src and
// the indices must not share memory with the table (core/memory_overlap.h): refused, as torch's index_copy_ does.
void scatter_table_rows(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src, const char* op);

// The checks that need no data: the kernels' and the operators' Meta kernels' (one set; the Python fake kernels call
// the Meta kernels). Sizes may be symbols.
void check_gather_arguments(const at::Tensor& table, const at::Tensor& indices, const char* op);
void check_scatter_arguments(const at::Tensor& table, const at::Tensor& indices, const at::Tensor& src,
                             const char* op);
// Where a gather's rows go: `device` if given, else the indices' device; 'cuda' without an index is the indices' GPU
// when they are on one, else the current device, as torch does (gather_table_rows and gather_dequant share it).
at::Device gather_output_device(const at::Tensor& indices, std::optional<at::Device> device);
// indices.shape + (dim,).
std::vector<int64_t> gathered_shape(const at::Tensor& indices, int64_t dim);
// indices.shape + (table.size(1),), with sizes that may be symbols (the Meta kernels).
std::vector<c10::SymInt> gathered_sym_shape(const at::Tensor& indices, const at::Tensor& table);

}  // namespace speedtorch

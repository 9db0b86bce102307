// One fused optimizer step on the rows of a table that a batch touched, in place, wherever the table lives:
// duplicate indices' gradients are summed first and each distinct row is updated exactly once, together with its
// optimizer state.
//
//   table on CPU (pinned or not), gradients on CPU -> CPU threads
//   table pinned, gradients on a GPU                -> a GPU kernel over UVA for one share of the rows, CPU threads
//                                                      for the rest (the transfer plan's split), concurrently
//   table and state on a GPU                        -> GPU kernel over device memory
#pragma once

#include <ATen/core/Tensor.h>

#include "cpu/index_range_check.h"
#include "core/row_optimizer_math.h"

namespace speedtorch {

// weights: (N, D) float32/float16/bfloat16, rows contiguous. state: (N, L) float32, L >= kStateHeaderFloats +
// state_slots(hyper) * D, rows contiguous, on the weights' device. indices: flat int32/int64 (M), any device.
// grad: (M, D) floating, any device. global_step: the table-wide step count after this step (>= 1).
//
// sorted_unique: the caller vouches that `indices` are strictly increasing (distinct), as torch.unique(sorted=True)
// returns them, so the de-duplication pass (a sort and a sum) is skipped. The claim is checked, never trusted: one
// pass on the host over CPU indices, or a compare of neighbours on the GPU read back with the span the step reads
// anyway; indices that break it raise before anything is updated (cpu/index_range_check.h). Nothing else about the
// step changes: the results equal those without the flag.
//
// updated_rows (needs sorted_unique): also receives each row's new weights, row i for indices[i], (M, D) in the
// table's dtype, contiguous, on the device that does the work (the gradients' GPU for a host table, else the
// table's device). A pipeline keeps them for the next batch's rows instead of reading the table again.
void apply_row_optimizer(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& indices,
                         const at::Tensor& grad, const OptimizerHyper& hyper, int64_t global_step, const char* op,
                         bool sorted_unique = false, const std::optional<at::Tensor>& updated_rows = std::nullopt);

// The checks of updated_rows (above): shape, dtype, layout and device, with what was expected.
void check_updated_rows(const at::Tensor& updated_rows, const at::Tensor& weights, const at::Tensor& indices,
                        const at::Device& device, bool sorted_unique, const char* op);

// The check behind sorted_unique=True, on indices of any device (also a row cache's steps, which sum duplicates
// themselves but hold callers to the same claim): strictly increasing and in [0, num_rows), else an error naming
// the position. CPU indices: one pass on the host. CUDA indices: neighbours compared on the GPU, read back with the
// first and last index (which bound the rest) in one wait; the host check words a failure. Returns the span.
IndexSpan check_sorted_unique_indices(const at::Tensor& indices, int64_t num_rows, const char* op);

// One gradient row per distinct index: the distinct values of `indices` (flat, host, int32/int64, validated)
// ascending as int64, and for each the float32 sum of its rows of `grad` (indices.numel() x D, any device) in
// position order from zero: torch.unique(sorted=True) and index_add_ into zeros, bit for bit, on the calling thread
// for a small batch (cpu/row_sum_cpu.h). The CPU routes' de-duplication (also the row cache's on the CPU).
std::pair<at::Tensor, at::Tensor> sum_duplicate_rows_cpu(const at::Tensor& indices, const at::Tensor& grad);

// Bytes from one row's record to the next as a step walks the table (the footprint a batch spans): the weights'
// row stride when each state row lies beside its weights row (PinnedEmbedding's state_beside_rows layout, one
// record per row), else the sum of both strides (two tables walked together).
int64_t optimizer_record_stride_bytes(const at::Tensor& weights, const at::Tensor& state);

// The kernels' view of a table: weights and state tensors, at the addresses the kernel will use.
OptimizerRows optimizer_rows(const at::Tensor& weights, const at::Tensor& state, char* weights_base,
                             float* state_base);

// Refuses grad or indices that share memory with the weights or the state (core/memory_overlap.h): a step reads
// them while it writes rows in place, in no set order (with sorted_unique, grad rows are read as they are). Called
// by apply_row_optimizer and the row cache's step, so that every placement refuses the same calls.
void check_step_inputs_apart(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& indices,
                             const at::Tensor& grad, const char* op);

// The shared checks of apply_row_optimizer (also used by the Meta kernel and the row cache): every check that needs
// no tensor values, the global step's among them.
void check_row_optimizer_arguments(const at::Tensor& weights, const at::Tensor& state, const at::Tensor& indices,
                                   const at::Tensor& grad, const OptimizerHyper& hyper, int64_t global_step,
                                   const char* op);

}  // namespace speedtorch

// Validation of row indices: every index must lie in [0, num_rows). The one place that decides and words it.
//
// Done before any row is touched, so a bad index is reported with its value and position and never reads or writes
// out of bounds. Parallel over the indices (cpu/helped_parallel_for.h); one pass, no allocation. Every route calls
// check_index_tensor: the CPU routes (transfer/row_transfer.cpp, the optimizer's CPU route) directly, the GPU
// routes through validate_indices (transfer/device_access.h), which summarizes CUDA indices on the GPU and comes
// here to name a bad one; Python code that checks ids itself calls check_index_tensor_on_any_device (the
// speedtorch::check_indices op). Only GPU kernels under deferred checks or CUDA graph capture flag bad indices
// themselves (cuda/device_index_error.h).
#pragma once

#include <ATen/core/Tensor.h>

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
// `shape`, when given with more than one dimension, is the indices' shape: the message then also names the element
// (arg[i, j]) of the caller's tensor.
template <typename Index>
IndexSpan check_indices_in_range(const Index* indices, int64_t count, int64_t num_rows, const char* op,
                                 const char* arg, at::IntArrayRef shape = {});

// check_indices_in_range over a host index tensor (int64 or int32, any shape), the argument named `arg`.
IndexSpan check_index_tensor(const at::Tensor& host_indices, int64_t num_rows, const char* op,
                             const char* arg = "indices");

// The same rule for an index tensor on any device, always checked (never deferred): CUDA indices are reduced on
// their GPU to their smallest and largest (one wait for that GPU's current stream), and come to the host only to
// name a bad one. For the GPU routes (transfer/device_access.h validate_indices) and for callers that need the
// answer before going on: Python's placements and distributed table call it as speedtorch::check_indices.
IndexSpan check_index_tensor_on_any_device(const at::Tensor& indices, int64_t num_rows, const char* op,
                                           const char* arg = "indices");

// For callers that vouch their indices are distinct (sorted_unique=True: what torch.unique returns): checks that a
// host index tensor is strictly increasing and in range, in one serial pass (its first and last then bound it).
// Throws c10::ValueError at the first position that is not above the one before it (the caller lied: nothing was
// touched), c10::IndexError for an index out of range; returns the span otherwise.
IndexSpan check_sorted_unique_index_tensor(const at::Tensor& host_indices, int64_t num_rows, const char* op);

}  // namespace speedtorch

// A per-device record that GPU kernels fill when they meet an index outside [0, num_rows).
//
// Kernels never touch a row for such an index; they flag it here, and the host raises a c10::IndexError naming the
// value and position, either at once (waiting for the caller's stream) or, in deferred mode and under CUDA graph
// capture, at the next speedtorch.check_index_errors().
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace speedtorch {

struct DeviceIndexError {
  int32_t flag;  // 0: none; 1: an out-of-range index was seen
  int32_t reserved;
  int64_t value;
  int64_t position;
  int64_t num_rows;
};

// The record of `device` (allocated and zeroed on first use; lives for the process).
DeviceIndexError* device_index_error_record(int device);

// Reports what the kernels enqueued so far on `stream` flagged: waits for `stream`, then throws c10::IndexError
// (and clears the record) if an index was out of range. Does nothing but return when deferred checks are on or
// `stream` is being captured into a CUDA graph.
void raise_if_device_index_error(int device, cudaStream_t stream, const char* op, const char* arg);

// Deferred mode: kernels still flag bad indices, but only check_deferred_index_errors() reports them.
void set_deferred_index_checks(bool deferred);
bool deferred_index_checks();

// Waits for every device that has a record and throws if any flagged an index (clearing it).
void check_deferred_index_errors();

}  // namespace speedtorch

// A per-device record that GPU kernels fill when they meet an index outside [0, num_rows).
//
// Kernels never touch a row for such an index; they flag it here. Only deferred checks read the record: by
// default every op validates its CUDA indices before launching anything (transfer/device_access.h,
// validate_indices: a summary kernel on the caller's stream and a wait for that stream only), so its kernels never meet
// a bad index and its error is raised in the calling thread. In deferred mode, and under CUDA graph capture, the
// kernels find bad indices and speedtorch.check_index_errors() reports them: the first flagged on each device since
// the last check, whichever thread or stream launched it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace speedtorch {

// What a record holds (row kernels leave it at 0: the record is zeroed whenever it is cleared).
enum DeviceErrorKind : int32_t {
  kBadRowIndex = 0,     // an index outside [0, num_rows)
  kNegativeToken = 1,   // speedtorch::ngram_hash: a token id < 0 (value, flat position)
  kBadBucketSize = 2,   // speedtorch::ngram_hash: a bucket size < 1 (value, column)
  kUnsortedRows = 3,    // an optimizer step told sorted_unique: an index not above the one before it (value, position)
};

struct DeviceIndexError {
  int32_t flag;  // 0: none; 1: a bad input was seen
  int32_t kind;  // DeviceErrorKind
  int64_t value;
  int64_t position;
  int64_t num_rows;
};

// The record of `device` (allocated and zeroed on first use; lives for the process). Lock-free once allocated:
// every launch asks for it.
DeviceIndexError* device_index_error_record(int device);

// Deferred mode: kernels still flag bad indices, but only check_deferred_index_errors() reports them. The setter is
// the process's; deferred_index_checks() is the mode on the calling thread: its latest entry of
// push_thread_deferred_index_checks still in force, else the process's.
void set_deferred_index_checks(bool deferred);
bool deferred_index_checks();
// The mode for the calling thread only, until pop_thread_deferred_index_checks(id) on this thread (Python's
// speedtorch.deferred_index_checks block); entries may be removed in any order. Returns the entry's id.
int64_t push_thread_deferred_index_checks(bool deferred);
// Removes the entry `id` of this thread; throws (naming `who`) when this thread holds none.
void pop_thread_deferred_index_checks(int64_t id, const char* who);

// A bad index met by host work in stream order (transfer/stream_ordered_staging.h: a host function checking the
// indices of a deferred-mode transfer): kept beside the device's record, reported by check_deferred_index_errors as
// the kernels' are (its device-wide wait includes host functions). The first one stays until it is reported. Never
// throws: host functions call it.
void flag_index_error_from_host(int device, int64_t value, int64_t position, int64_t num_rows) noexcept;

// Waits for every device that has a record (device-wide: the record may be written from any stream), then throws
// c10::IndexError for the first device whose record is flagged, clearing it.
void check_deferred_index_errors();

}  // namespace speedtorch

// Launchers of the GPU row kernels. Pointers may be device memory or host memory mapped into the GPU's address
// space (UVA): the kernels read and write either the same way. All launches are asynchronous on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/device_index_error.h"

namespace speedtorch {

struct GpuRows {
  char* base;  // device-accessible address of row 0
  int64_t num_rows;
  int64_t row_stride_bytes;
  int64_t row_bytes;
};

struct GpuIndices {
  const void* data;  // device-accessible
  bool is_int64;     // else int32
  int64_t count;
};

// out[i] = table[indices[i]]. A bad index is flagged in `error` and its output row filled with NaN bytes.
void launch_row_gather(const GpuRows& table, const GpuIndices& indices, char* out, DeviceIndexError* error,
                       int sm_count, cudaStream_t stream);

// table[indices[i]] = src[i] for positions with keep[i] != 0 (all positions when keep is null; the caller then
// guarantees distinct indices). A bad index is flagged in `error` and nothing is written for it.
void launch_row_scatter(const GpuRows& table, const GpuIndices& indices, const char* src, const uint8_t* keep,
                        DeviceIndexError* error, int sm_count, cudaStream_t stream);

// keep[i] = 1 iff indices[i] is in [0, num_rows) and no later position holds the same index ("last occurrence
// wins"). `scratch` must hold last_occurrence_scratch_bytes(count) bytes of device memory.
int64_t last_occurrence_scratch_bytes(int64_t count);
void launch_mark_last_occurrence(const GpuIndices& indices, int64_t num_rows, void* scratch, uint8_t* keep,
                                 int sm_count, cudaStream_t stream);

}  // namespace speedtorch

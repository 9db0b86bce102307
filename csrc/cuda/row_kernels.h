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
  // When not null, entry i of `data` belongs to position positions[i] of the batch: the indices were sorted so
  // that concurrently running warps touch nearby host pages (UVA translation is the limit over large tables).
  const int64_t* positions = nullptr;
};

// How a row kernel is launched: at most `max_blocks` blocks (the grid strides over the rest), each group of lanes
// keeping `rows_in_flight` rows' loads outstanding before it stores any (1, 2, 4 or 8; rows whose size is not a
// multiple of 8 bytes always use 4). Over PCIe the bytes in flight, not the instructions, set the rate.
struct RowLaunch {
  int max_blocks;
  int rows_in_flight = 4;
};

// out[p] = table[indices[i]] with p the position of entry i. A bad index is flagged in `error` and its output
// row filled with NaN bytes.
void launch_row_gather(const GpuRows& table, const GpuIndices& indices, char* out, DeviceIndexError* error,
                       const RowLaunch& launch, cudaStream_t stream);

// table[indices[i]] = src[p] for entries whose position p has keep[p] != 0 (all entries when keep is null; the
// caller then guarantees distinct indices). A bad index is flagged in `error` and nothing is written for it; when
// `abort` (device memory) is set, by an earlier kernel that saw a bad index, nothing is written at all.
void launch_row_scatter(const GpuRows& table, const GpuIndices& indices, const char* src, const uint8_t* keep,
                        const int32_t* abort, DeviceIndexError* error, const RowLaunch& launch, cudaStream_t stream);

// keep[i] = 1 iff indices[i] is in [0, num_rows) and no later position holds the same index ("last occurrence
// wins"). `scratch` must hold last_occurrence_scratch_bytes(count) bytes of device memory. A bad index is flagged
// in `error` and sets *abort (device memory, zeroed by the caller), so a scatter can write all rows or none.
int64_t last_occurrence_scratch_bytes(int64_t count);
void launch_mark_last_occurrence(const GpuIndices& indices, int64_t num_rows, void* scratch, uint8_t* keep,
                                 int32_t* abort, DeviceIndexError* error, int max_blocks, cudaStream_t stream);

// Sorting a UVA share by row for locality (locality_sort_kernel.cu): only the bits above `bucket_bytes` of table are
// sorted.
struct LocalitySortPlan {
  int begin_bit = 0;
  int end_bit = 0;
  size_t temp_bytes = 0;  // device scratch launch_locality_sort needs
};
LocalitySortPlan plan_locality_sort(const GpuIndices& indices, int64_t num_rows, int64_t row_stride_bytes,
                                    int64_t bucket_bytes);
// sorted_out: count indices of the input's type; positions_out and iota_scratch: count int64 each.
void launch_locality_sort(const GpuIndices& indices, const LocalitySortPlan& plan, void* temp, void* sorted_out,
                          int64_t* positions_out, int64_t* iota_scratch, int max_blocks, cudaStream_t stream);

}  // namespace speedtorch

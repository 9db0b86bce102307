// Launcher of the GPU gather that dequantizes as it reads (speedtorch::gather_dequant; formats in
// core/row_formats.h). The table may be device memory or pinned host memory mapped for the GPU (UVA).
#pragma once

#include <c10/util/BFloat16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/device_index_error.h"
#include "cuda/row_kernels.h"
#include "core/row_formats.h"

namespace speedtorch {

struct QuantizedGpuRows {
  const char* base;  // device-accessible address of row 0
  int64_t num_rows;
  int64_t row_stride_bytes;
  int64_t row_width_bytes;  // bytes of each row the table tensor spans (>= format_row_bytes; loads stay inside)
  RowFormat format;
  int64_t dim;
};

// The largest row (format_row_bytes) the kernel stages in shared memory for the quantized formats.
constexpr int64_t kMaxDequantRowBytes = 6144;

// out[p * dim + j] = element j of row indices[i], dequantized to bfloat16, p the position of entry i (as
// launch_row_gather: indices.positions may map sorted entries back). indices.data may be null: entry i is row i.
// A bad index is flagged in `error` and its output row filled with NaN bytes. At most `launch.max_blocks` blocks;
// each lane keeps `launch.rows_in_flight` 16-byte loads in flight (the row gather's rows in flight: a warp takes
// as many rows at once as fill them).
void launch_gather_dequant(const QuantizedGpuRows& table, const GpuIndices& indices, c10::BFloat16* out,
                           DeviceIndexError* error, const RowLaunch& launch, cudaStream_t stream);

}  // namespace speedtorch

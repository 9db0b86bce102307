// Launcher of the summary of a batch of CUDA indices in one kernel (index_summary_kernel.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/row_kernels.h"

namespace speedtorch {

struct IndexSummary {
  int64_t min;
  int64_t max;
  int64_t first_descent;         // smallest i with indices[i] < indices[i - 1]; -1: sorted (non-decreasing)
  int64_t first_not_increasing;  // smallest i with indices[i] <= indices[i - 1]; -1: strictly increasing
};

// Device memory the blocks fold their parts into; the last block resets it, so it must start as
// index_summary_scratch_identity() and be used by one launch at a time.
struct IndexSummaryScratch {
  long long min;
  long long max;
  long long first_descent;
  long long first_not_increasing;
  unsigned int blocks_done;
  unsigned int reserved;
};
IndexSummaryScratch index_summary_scratch_identity();

// Writes the summary of indices (count >= 1) to `out`, memory the GPU can write and the host read after waiting for
// `stream` (mapped pinned memory). Asynchronous on `stream`.
void launch_index_summary(const GpuIndices& indices, IndexSummaryScratch* scratch, IndexSummary* out,
                          cudaStream_t stream);

}  // namespace speedtorch

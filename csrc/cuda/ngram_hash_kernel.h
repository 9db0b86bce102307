// Launcher of the GPU n-gram hash (speedtorch::ngram_hash; the math is core/ngram_hash_math.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/device_index_error.h"
#include "core/ngram_hash_math.h"

namespace speedtorch {

// out[b, t, (n-2) * heads + h] for every position and column. All pointers are device memory: tokens (batch x seq,
// int64 when tokens_int64, else int32), starts (batch x seq bools, or null), multipliers (heads x max_order),
// bucket_sizes ((max_order - 1) x heads). A token < 0 or a bucket size < 1 is flagged in `error` (for deferred
// checks) and the ids it would produce are written as -1, so a gather that follows flags them too and reads no row.
// Asynchronous on `stream`.
void launch_ngram_hash(const void* tokens, bool tokens_int64, const bool* starts, int64_t batch, int64_t seq,
                       const NgramHashShape& shape, const uint64_t* multipliers, const int64_t* bucket_sizes,
                       int64_t* out, DeviceIndexError* error, cudaStream_t stream);

}  // namespace speedtorch

// Launchers of the row cache's kernels (cache/row_cache.h; layout in core/row_cache_slots.h): the same operations
// as cpu/row_cache_cpu.h, on device memory, with the host table read and written over UVA. All asynchronous on
// `stream`; nothing waits for the GPU. Indices are valid row ids (checked by the caller).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/row_cache_slots.h"

namespace speedtorch {

// assign_cache_slots_cpu on the GPU: one warp per id, holding its set's lock (cache.set_locks, one zeroed int per
// set) while it looks the id up and fills or evicts, so no two warps touch one set, slot or host row at once.
void launch_assign_cache_slots(const CacheSlots& cache, const CacheHostRows& host, const int64_t* ids, int64_t count,
                               int64_t now, bool for_update, int64_t* slots, cudaStream_t stream);

// read_cached_rows_cpu on the GPU (out: device memory).
void launch_read_cached_rows(const CacheSlots& cache, const CacheHostRows& host, const int64_t* ids,
                             const int64_t* slots, int64_t count, char* out, cudaStream_t stream);

// flush_cache_slots_cpu on the GPU.
void launch_flush_cache_slots(const CacheSlots& cache, const CacheHostRows& host, bool empty, cudaStream_t stream);

}  // namespace speedtorch

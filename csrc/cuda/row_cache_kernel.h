// Launchers of the row cache's kernels (cache/row_cache.h; layout in cache/row_cache_slots.h): the same operations
// as cpu/row_cache_cpu.h, on device memory, with the host table read and written over UVA. All asynchronous on
// `stream`; nothing waits for the GPU. Indices are valid row ids (checked by the caller).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cache/row_cache_slots.h"

namespace speedtorch {

// keys[i] = cache_set_of(ids[i]) * num_rows + ids[i]: sorted, they group the ids by set (and duplicates together).
void launch_cache_keys(const int64_t* ids, int64_t count, int64_t sets, int64_t num_rows, int64_t* keys,
                       cudaStream_t stream);

// assign_cache_slots_cpu on the GPU. sorted_keys (ascending) and order (their positions in the batch) come from a
// sort of launch_cache_keys' output; one warp walks each set's ids, its lanes the set's ways, so no two warps touch
// one slot or one host row. slots[order[i]] receives the slot of the i-th sorted id.
void launch_assign_cache_slots(const CacheSlots& cache, const CacheHostRows& host, const int64_t* sorted_keys,
                               const int64_t* order, int64_t count, int64_t now, bool mark_dirty, int64_t* slots,
                               cudaStream_t stream);

// read_cached_rows_cpu on the GPU (out: device memory).
void launch_read_cached_rows(const CacheSlots& cache, const CacheHostRows& host, const int64_t* ids,
                             const int64_t* slots, int64_t count, char* out, cudaStream_t stream);

// flush_cache_slots_cpu on the GPU.
void launch_flush_cache_slots(const CacheSlots& cache, const CacheHostRows& host, bool empty, cudaStream_t stream);

}  // namespace speedtorch

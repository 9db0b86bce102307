// The row cache's operations on CPU memory (cache/row_cache.h; layout in core/row_cache_slots.h): the same logic
// as the CUDA kernels (cuda/row_cache_kernel.cu), so every path of the cache runs and is tested without a GPU.
// Indices are valid row ids (checked by the caller).
#pragma once

#include <cstdint>

#include "core/row_cache_slots.h"

namespace speedtorch {

// For each position i: the slot holding row ids[i] after the call, or -1 when its set has no slot left that this
// call does not use (the row stays on the host only). Misses take the least recently used slot of their set, whose
// row (when dirty) is first written back. `now` is this call's tick (greater than every earlier one); with
// for_update the slots returned also hold the rows' optimizer state and are marked dirty (the caller is about to
// update them).
void assign_cache_slots_cpu(const CacheSlots& cache, const CacheHostRows& host, const int64_t* ids, int64_t count,
                            int64_t now, bool for_update, int64_t* slots);

// out[i] = the weights of row ids[i]: from slot slots[i], or from the host when it is -1. out: count dense rows.
void read_cached_rows_cpu(const CacheSlots& cache, const CacheHostRows& host, const int64_t* ids,
                          const int64_t* slots, int64_t count, char* out);

// Writes every dirty slot back to the host and marks it clean; with `empty`, also empties every slot.
void flush_cache_slots_cpu(const CacheSlots& cache, const CacheHostRows& host, bool empty);

}  // namespace speedtorch

// The memory of a row cache (cache/row_cache.h) as its CPU loops (cpu/row_cache_cpu.cpp) and CUDA kernels
// (cuda/row_cache_kernel.cu) see it: plain pointers and strides, so one description serves both. Also the one
// definition of which set a row id belongs to.
//
// The cache is set-associative: `sets` sets of `ways` slots; row `id` may only occupy a slot of set
// cache_set_of(id). Each slot holds a row id (-1: empty), the tick of its last use (-1: empty; the victim of a miss
// is the slot of its set with the oldest tick not used by the current call), a dirty flag (its row or state differs
// from the host's copy), and copies of the row's weights and, once an optimizer step needs it, its optimizer state
// (a gather fills the weights only: serving never moves state).
#pragma once

#include <cstdint>

#include "core/id_mix.h"

#if defined(__CUDACC__)
#define SPEEDTORCH_CACHE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SPEEDTORCH_CACHE_HOST_DEVICE inline
#endif

namespace speedtorch {

struct CacheSlots {
  int64_t* ids;     // slot -> row id, -1 when empty
  int64_t* ticks;   // slot -> the call that last used it, -1 when empty
  int32_t* dirty;   // slot -> 1 when its weights or state must be written back
  int32_t* state_loaded;  // slot -> 1 when its optimizer state has been copied in (always so when dirty)
  int32_t* set_locks;     // set -> 1 while a GPU warp works on it (nullptr on the CPU)
  char* rows;       // slot 0's weights
  int64_t row_stride_bytes;
  float* state;     // slot 0's optimizer state (nullptr without optimizer)
  int64_t state_stride_floats;
  int64_t sets;
  int32_t ways;
  // [hits, misses] of gathers' lookups (updates are not counted: they follow a gather of the same rows), in the
  // cache's memory; nullptr: not counted. Folded into the library counters when they are read (cache/row_cache.h).
  int64_t* lookups;
};

// The host table the cache stands in front of, at the addresses the code touching it uses (host pointers on the CPU,
// mapped UVA addresses in kernels).
struct CacheHostRows {
  char* rows;
  int64_t row_stride_bytes;
  float* state;  // nullptr without optimizer
  int64_t state_stride_floats;
  int64_t num_rows;
  int64_t row_bytes;     // dim * element size: the bytes of a row that are copied
  int64_t state_floats;  // the floats of a state row that are copied (0 without optimizer)
};

// The set of row `id`: its mix (core/id_mix.h), so that strided ids spread over the sets.
SPEEDTORCH_CACHE_HOST_DEVICE int64_t cache_set_of(int64_t id, int64_t sets) {
  return static_cast<int64_t>(mix_id(id) % static_cast<uint64_t>(sets));
}

}  // namespace speedtorch

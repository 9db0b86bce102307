// The row cache's kernels (see row_cache_kernel.h). A warp handles one row at a time; its lanes copy the row's bytes
// (16 at a time when the addresses allow) or, when a set is searched, hold one way each.
#include <c10/cuda/CUDAException.h>

#include <cstdint>

#include "cuda/launch_shape.h"
#include "cuda/row_cache_kernel.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

using row_access::kThreadsPerBlock;
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kNoCandidate = INT64_MAX;

// Copies `bytes` from src to dst with the 32 lanes of a warp. Rows read or written once, one side of them host
// memory over PCIe: streaming loads and stores (row_vector_access.cuh).
template <typename V>
__device__ void warp_copy_as(char* dst, const char* src, int64_t bytes, int lane) {
  auto* d = reinterpret_cast<V*>(dst);
  const auto* s = reinterpret_cast<const V*>(src);
  for (int64_t i = lane; i < bytes / static_cast<int64_t>(sizeof(V)); i += kWarp) {
    row_access::store_streaming(d + i, row_access::load_streaming(s + i));
  }
}

__device__ void warp_copy(char* dst, const char* src, int64_t bytes, int lane) {
  const auto bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | static_cast<uintptr_t>(bytes);
  if (bits % 16 == 0) {
    warp_copy_as<uint4>(dst, src, bytes, lane);
  } else if (bits % 4 == 0) {
    warp_copy_as<unsigned int>(dst, src, bytes, lane);
  } else {
    warp_copy_as<unsigned char>(dst, src, bytes, lane);
  }
}

// Writes a slot's weights (and its state, when loaded) back to the host row `id`.
__device__ void copy_slot_to_host(const CacheSlots& c, const CacheHostRows& h, int64_t slot, int64_t id, int lane) {
  warp_copy(h.rows + id * h.row_stride_bytes, c.rows + slot * c.row_stride_bytes, h.row_bytes, lane);
  if (h.state_floats > 0 && c.state_loaded[slot]) {
    warp_copy(reinterpret_cast<char*>(h.state + id * h.state_stride_floats),
              reinterpret_cast<const char*>(c.state + slot * c.state_stride_floats), h.state_floats * 4, lane);
  }
}


// Loads that skip the SM's L1 cache: slots and host rows written by warps of other SMs during this kernel (under
// their set's lock) must be read from L2.
template <typename T>
__device__ T load_l2(const T* p) {
  return __ldcg(p);
}
__device__ int64_t load_l2(const int64_t* p) {
  return static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(p)));
}

// warp_copy whose loads skip L1 (see load_l2).
__device__ void warp_copy_l2(char* dst, const char* src, int64_t bytes, int lane) {
  const auto bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | static_cast<uintptr_t>(bytes);
  if (bits % 16 == 0) {
    auto* d = reinterpret_cast<uint4*>(dst);
    const auto* s = reinterpret_cast<const uint4*>(src);
    for (int64_t i = lane; i < bytes / 16; i += kWarp) d[i] = __ldcg(s + i);
  } else if (bits % 4 == 0) {
    auto* d = reinterpret_cast<unsigned int*>(dst);
    const auto* s = reinterpret_cast<const unsigned int*>(src);
    for (int64_t i = lane; i < bytes / 4; i += kWarp) d[i] = __ldcg(s + i);
  } else {
    const auto* s = reinterpret_cast<const signed char*>(src);
    for (int64_t i = lane; i < bytes; i += kWarp) dst[i] = static_cast<char>(__ldcg(s + i));
  }
}

// Writes a slot's weights (and its state, when loaded) back to the host row `id`.
__device__ void copy_slot_to_host_l2(const CacheSlots& c, const CacheHostRows& h, int64_t slot, int64_t id,
                                     int lane) {
  warp_copy_l2(h.rows + id * h.row_stride_bytes, c.rows + slot * c.row_stride_bytes, h.row_bytes, lane);
  if (h.state_floats > 0 && load_l2(c.state_loaded + slot)) {
    warp_copy_l2(reinterpret_cast<char*>(h.state + id * h.state_stride_floats),
                 reinterpret_cast<const char*>(c.state + slot * c.state_stride_floats), h.state_floats * 4, lane);
  }
}

__device__ void load_state_l2(const CacheSlots& c, const CacheHostRows& h, int64_t slot, int64_t id, int lane) {
  if (h.state_floats > 0) {
    warp_copy_l2(reinterpret_cast<char*>(c.state + slot * c.state_stride_floats),
                 reinterpret_cast<const char*>(h.state + id * h.state_stride_floats), h.state_floats * 4, lane);
  }
}

// One warp per id. The warp takes its set's lock (one int per set), so the ids of one set are handled one at a time,
// in whatever order the warps arrive: the order decides which rows stay cached, never a value. Inside the lock the
// lanes hold one way each: a hit is a ballot, a miss takes the way with the oldest tick not used by this call.
__global__ void __launch_bounds__(kThreadsPerBlock)
    assign_cache_slots_kernel(CacheSlots c, CacheHostRows h, const int64_t* ids, int64_t count, int64_t now,
                              int for_update, int64_t* slots) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  // Gathers count hits and misses per block, then add them once: one global atomic per block, not per id.
  __shared__ unsigned long long block_lookups[2];
  if (threadIdx.x < 2) block_lookups[threadIdx.x] = 0;
  __syncthreads();
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; i < count; i += warps) {
    const int64_t id = ids[i];
    const int64_t set = cache_set_of(id, c.sets);
    if (lane == 0) {
      while (atomicCAS(c.set_locks + set, 0, 1) != 0) __nanosleep(64);
      __threadfence();  // acquire: what the lock's previous holder wrote is visible
    }
    __syncwarp();
    const int64_t first = set * c.ways;
    const int64_t mine = first + lane;  // this lane's way
    const bool has_way = lane < c.ways;
    const int64_t my_id = has_way ? load_l2(c.ids + mine) : -2;
    const unsigned hits = __ballot_sync(kFullMask, my_id == id);
    if (!for_update && lane == 0) atomicAdd(&block_lookups[hits != 0 ? 0 : 1], 1ULL);
    int64_t slot;
    if (hits != 0) {
      slot = first + __ffs(hits) - 1;
      if (for_update && !load_l2(c.state_loaded + slot)) {  // cached by a gather: the weights only
        load_state_l2(c, h, slot, id, lane);
        __syncwarp();
        if (lane == 0) c.state_loaded[slot] = 1;
      }
    } else {
      const int64_t my_tick = has_way ? load_l2(c.ticks + mine) : kNoCandidate;
      int64_t tick = my_tick < now ? my_tick : kNoCandidate;
      int way = lane;
      for (int offset = kWarp / 2; offset > 0; offset /= 2) {
        const int64_t other_tick = __shfl_xor_sync(kFullMask, tick, offset);
        const int other_way = __shfl_xor_sync(kFullMask, way, offset);
        if (other_tick < tick || (other_tick == tick && other_way < way)) {
          tick = other_tick;
          way = other_way;
        }
      }
      if (tick == kNoCandidate) {
        slot = -1;  // every way holds a row of this call: the row stays on the host
      } else {
        slot = first + way;
        const int64_t old = load_l2(c.ids + slot);
        if (old >= 0 && load_l2(c.dirty + slot)) copy_slot_to_host_l2(c, h, slot, old, lane);
        warp_copy_l2(c.rows + slot * c.row_stride_bytes, h.rows + id * h.row_stride_bytes, h.row_bytes, lane);
        if (for_update) load_state_l2(c, h, slot, id, lane);
        __syncwarp();  // every lane has read the slot's old id and flags
        if (lane == 0) {
          c.ids[slot] = id;
          c.dirty[slot] = 0;
          c.state_loaded[slot] = for_update ? 1 : 0;
        }
      }
    }
    if (lane == 0 && slot >= 0) {
      c.ticks[slot] = now;
      if (for_update) c.dirty[slot] = 1;
    }
    if (lane == 0) slots[i] = slot;
    __threadfence();  // release: every lane's writes reach L2 before the lock is seen free
    __syncwarp();
    if (lane == 0) atomicExch(c.set_locks + set, 0);
  }
  // Every warp of the block is past the loop and holds no set lock here.
  __syncthreads();
  if (c.lookups != nullptr && threadIdx.x < 2 && block_lookups[threadIdx.x] != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(c.lookups) + threadIdx.x, block_lookups[threadIdx.x]);
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    read_cached_rows_kernel(CacheSlots c, CacheHostRows h, const int64_t* ids, const int64_t* slots, int64_t count,
                            char* out) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; i < count; i += warps) {
    const int64_t slot = slots[i];
    const char* src = slot >= 0 ? c.rows + slot * c.row_stride_bytes : h.rows + ids[i] * h.row_stride_bytes;
    warp_copy(out + i * h.row_bytes, src, h.row_bytes, lane);
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    flush_cache_slots_kernel(CacheSlots c, CacheHostRows h, int empty) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t slots = c.sets * c.ways;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  for (int64_t s = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; s < slots; s += warps) {
    const int64_t id = c.ids[s];
    const bool write = id >= 0 && c.dirty[s];
    if (write) copy_slot_to_host(c, h, s, id, lane);
    __syncwarp();
    if (lane == 0) {
      if (write) c.dirty[s] = 0;
      if (empty) {
        c.ids[s] = -1;
        c.ticks[s] = -1;
        c.state_loaded[s] = 0;
      }
    }
  }
}

unsigned warp_blocks(int64_t warps, int64_t cap) {
  const int64_t blocks = (warps * kWarp + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(blocks < cap ? (blocks < 1 ? 1 : blocks) : cap);
}

constexpr int64_t kMaxGrid = 1 << 16;

}  // namespace

void launch_assign_cache_slots(const CacheSlots& cache, const CacheHostRows& host, const int64_t* ids, int64_t count,
                               int64_t now, bool for_update, int64_t* slots, cudaStream_t stream) {
  if (count == 0) return;
  assign_cache_slots_kernel<<<warp_blocks(count, kMaxGrid), kThreadsPerBlock, 0, stream>>>(
      cache, host, ids, count, now, for_update ? 1 : 0, slots);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_read_cached_rows(const CacheSlots& cache, const CacheHostRows& host, const int64_t* ids,
                             const int64_t* slots, int64_t count, char* out, cudaStream_t stream) {
  if (count == 0) return;
  read_cached_rows_kernel<<<warp_blocks(count, kMaxGrid), kThreadsPerBlock, 0, stream>>>(cache, host, ids, slots,
                                                                                         count, out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_flush_cache_slots(const CacheSlots& cache, const CacheHostRows& host, bool empty, cudaStream_t stream) {
  const int64_t slots = cache.sets * cache.ways;
  if (slots == 0) return;
  flush_cache_slots_kernel<<<warp_blocks(slots, kMaxGrid), kThreadsPerBlock, 0, stream>>>(cache, host,
                                                                                          empty ? 1 : 0);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace speedtorch

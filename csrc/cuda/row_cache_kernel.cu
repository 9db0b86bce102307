// The row cache's kernels (see row_cache_kernel.h). A warp handles one row at a time; its lanes copy the row's bytes
// (16 at a time when the addresses allow) or, when a set is searched, hold one way each.
#include <c10/cuda/CUDAException.h>

#include <cstdint>

#include "cuda/launch_shape.h"
#include "cuda/row_cache_kernel.h"

namespace speedtorch {
namespace {

using row_access::kThreadsPerBlock;
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kNoCandidate = INT64_MAX;

// Copies `bytes` from src to dst with the 32 lanes of a warp.
__device__ void warp_copy(char* dst, const char* src, int64_t bytes, int lane) {
  const auto bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | static_cast<uintptr_t>(bytes);
  if (bits % 16 == 0) {
    auto* d = reinterpret_cast<uint4*>(dst);
    const auto* s = reinterpret_cast<const uint4*>(src);
    for (int64_t i = lane; i < bytes / 16; i += kWarp) d[i] = s[i];
  } else if (bits % 4 == 0) {
    auto* d = reinterpret_cast<uint32_t*>(dst);
    const auto* s = reinterpret_cast<const uint32_t*>(src);
    for (int64_t i = lane; i < bytes / 4; i += kWarp) d[i] = s[i];
  } else {
    for (int64_t i = lane; i < bytes; i += kWarp) dst[i] = src[i];
  }
}

__device__ void copy_slot_to_host(const CacheSlots& c, const CacheHostRows& h, int64_t slot, int64_t id, int lane) {
  warp_copy(h.rows + id * h.row_stride_bytes, c.rows + slot * c.row_stride_bytes, h.row_bytes, lane);
  if (h.state_floats > 0) {
    warp_copy(reinterpret_cast<char*>(h.state + id * h.state_stride_floats),
              reinterpret_cast<const char*>(c.state + slot * c.state_stride_floats), h.state_floats * 4, lane);
  }
}

__device__ void copy_host_to_slot(const CacheSlots& c, const CacheHostRows& h, int64_t slot, int64_t id, int lane) {
  warp_copy(c.rows + slot * c.row_stride_bytes, h.rows + id * h.row_stride_bytes, h.row_bytes, lane);
  if (h.state_floats > 0) {
    warp_copy(reinterpret_cast<char*>(c.state + slot * c.state_stride_floats),
              reinterpret_cast<const char*>(h.state + id * h.state_stride_floats), h.state_floats * 4, lane);
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock)
    cache_keys_kernel(const int64_t* ids, int64_t count, int64_t sets, int64_t num_rows, int64_t* keys) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) keys[i] = cache_set_of(ids[i], sets) * num_rows + ids[i];
}

// One warp per sorted position; the warp at the first position of a set walks all of that set's ids in order.
__global__ void __launch_bounds__(kThreadsPerBlock)
    assign_cache_slots_kernel(CacheSlots c, CacheHostRows h, const int64_t* sorted_keys, const int64_t* order,
                              int64_t count, int64_t now, int mark_dirty, int64_t* slots) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t p = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (p >= count) return;
  const int64_t set = sorted_keys[p] / h.num_rows;
  if (p > 0 && sorted_keys[p - 1] / h.num_rows == set) return;  // another warp walks this set
  const int64_t first = set * c.ways;
  const int64_t mine = first + lane;  // this lane's way
  const bool has_way = lane < c.ways;
  for (int64_t q = p; q < count && sorted_keys[q] / h.num_rows == set; ++q) {
    const int64_t id = sorted_keys[q] - set * h.num_rows;
    const unsigned hits = __ballot_sync(kFullMask, has_way && c.ids[mine] == id);
    int64_t slot;
    if (hits != 0) {
      slot = first + __ffs(hits) - 1;
    } else {
      // The least recently used way this call has not used yet (lowest way on ties).
      int64_t tick = has_way && c.ticks[mine] < now ? c.ticks[mine] : kNoCandidate;
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
        const int64_t old = c.ids[slot];
        if (old >= 0 && c.dirty[slot]) copy_slot_to_host(c, h, slot, old, lane);
        copy_host_to_slot(c, h, slot, id, lane);
        __syncwarp();  // every lane has read the slot's old id and dirty flag
        if (lane == 0) {
          c.ids[slot] = id;
          c.dirty[slot] = 0;
        }
      }
    }
    if (lane == 0) {
      if (slot >= 0) {
        c.ticks[slot] = now;
        if (mark_dirty) c.dirty[slot] = 1;
      }
      slots[order[q]] = slot;
    }
    __syncwarp();  // lane 0's writes are seen by the whole warp at the next id
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

void launch_cache_keys(const int64_t* ids, int64_t count, int64_t sets, int64_t num_rows, int64_t* keys,
                       cudaStream_t stream) {
  if (count == 0) return;
  const auto blocks = static_cast<unsigned>((count + kThreadsPerBlock - 1) / kThreadsPerBlock);
  cache_keys_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(ids, count, sets, num_rows, keys);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_assign_cache_slots(const CacheSlots& cache, const CacheHostRows& host, const int64_t* sorted_keys,
                               const int64_t* order, int64_t count, int64_t now, bool mark_dirty, int64_t* slots,
                               cudaStream_t stream) {
  if (count == 0) return;
  // One warp per position (no grid stride: the warp of a set's first position must exist).
  const int64_t blocks = (count * kWarp + kThreadsPerBlock - 1) / kThreadsPerBlock;
  assign_cache_slots_kernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      cache, host, sorted_keys, order, count, now, mark_dirty ? 1 : 0, slots);
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

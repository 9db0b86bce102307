// Marks, for each position, whether it holds the last occurrence of its index: the rule that makes scatter_ with
// duplicate indices deterministic ("last wins", as a sequential loop) and lets every row have exactly one writer.
//
// An open-addressing hash table in scratch memory maps each index to the largest position holding it (atomicCAS
// to claim a slot, atomicMax for the position); a second pass compares. O(count) work, no sort.
#include <c10/cuda/CUDAException.h>

#include "cuda/row_kernels.h"
#include "cuda/row_vector_access.cuh"

namespace speedtorch {
namespace {

constexpr unsigned long long kEmpty = ~0ull;

// Power-of-two slot count with a load factor of at most one half.
int64_t slot_count(int64_t count) {
  int64_t slots = 1024;
  while (slots < 2 * count) slots *= 2;
  return slots;
}

__device__ __forceinline__ uint64_t slot_of(uint64_t key, uint64_t mask) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return key & mask;
}

template <typename Index>
__global__ void insert_last_positions(const Index* __restrict__ indices, int64_t count, int64_t num_rows,
                                      unsigned long long* keys, unsigned long long* last_plus_one, uint64_t mask,
                                      int32_t* abort, DeviceIndexError* error) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    if (row < 0 || row >= num_rows) {  // reported here, before any row is written
      *abort = 1;
      if (atomicCAS(&error->flag, 0, 1) == 0) {
        error->value = row;
        error->position = i;
        error->num_rows = num_rows;
      }
      continue;
    }
    const unsigned long long key = static_cast<unsigned long long>(row);
    for (uint64_t s = slot_of(key, mask);; s = (s + 1) & mask) {
      const unsigned long long prev = atomicCAS(&keys[s], kEmpty, key);
      if (prev == kEmpty || prev == key) {
        atomicMax(&last_plus_one[s], static_cast<unsigned long long>(i) + 1);
        break;
      }
    }
  }
}

template <typename Index>
__global__ void mark_last_positions(const Index* __restrict__ indices, int64_t count, int64_t num_rows,
                                    const unsigned long long* keys, const unsigned long long* last_plus_one,
                                    uint64_t mask, uint8_t* keep) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t row = static_cast<int64_t>(indices[i]);
    uint8_t last = 0;
    if (row >= 0 && row < num_rows) {
      const unsigned long long key = static_cast<unsigned long long>(row);
      uint64_t s = slot_of(key, mask);
      while (keys[s] != key) s = (s + 1) & mask;
      last = last_plus_one[s] == static_cast<unsigned long long>(i) + 1;
    }
    keep[i] = last;
  }
}

template <typename Index>
void launch(const Index* idx, int64_t count, int64_t num_rows, void* scratch, uint8_t* keep, int32_t* abort,
            DeviceIndexError* error, int max_blocks, cudaStream_t stream) {
  const int64_t slots = slot_count(count);
  auto* keys = static_cast<unsigned long long*>(scratch);
  auto* last = keys + slots;
  C10_CUDA_CHECK(cudaMemsetAsync(keys, 0xFF, slots * sizeof(unsigned long long), stream));
  C10_CUDA_CHECK(cudaMemsetAsync(last, 0, slots * sizeof(unsigned long long), stream));
  const unsigned grid = row_access::grid_for(count, 1, max_blocks);
  insert_last_positions<Index><<<grid, row_access::kThreadsPerBlock, 0, stream>>>(idx, count, num_rows, keys, last,
                                                                                  slots - 1, abort, error);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  mark_last_positions<Index><<<grid, row_access::kThreadsPerBlock, 0, stream>>>(idx, count, num_rows, keys, last,
                                                                                slots - 1, keep);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

int64_t last_occurrence_scratch_bytes(int64_t count) {
  return 2 * slot_count(count) * static_cast<int64_t>(sizeof(unsigned long long));
}

void launch_mark_last_occurrence(const GpuIndices& indices, int64_t num_rows, void* scratch, uint8_t* keep,
                                 int32_t* abort, DeviceIndexError* error, int max_blocks, cudaStream_t stream) {
  if (indices.count == 0) return;
  if (indices.is_int64) {
    launch(static_cast<const int64_t*>(indices.data), indices.count, num_rows, scratch, keep, abort, error, max_blocks,
           stream);
  } else {
    launch(static_cast<const int32_t*>(indices.data), indices.count, num_rows, scratch, keep, abort, error, max_blocks,
           stream);
  }
}

}  // namespace speedtorch

// The GPU routes of RowCache (cache/row_cache.h), apart so that the class builds without CUDA. Each runs on the
// current stream of the cache's GPU, after the cache's previous call (whatever stream that ran on).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <array>
#include <optional>
#include <utility>

#include "cache/row_cache.h"
#include "core/row_cache_slots.h"

namespace speedtorch {

struct CacheTensors {  // the slot tensors, for stream bookkeeping
  at::Tensor ids, ticks, dirty, state_loaded, set_locks, rows, state;
};

// Checked indices (any device) as flat int64 ids on the cache's GPU; the current stream first waits for the cache's
// previous call.
at::Tensor cache_ids_on_gpu(std::optional<c10::Stream>& last_stream, const CacheTensors& slots,
                            const at::Tensor& indices,
                            int64_t num_rows, at::Device device, const char* op);
// The slot of each id (-1: on the host only), assigning and filling slots for the misses; for_update: as
// assign_cache_slots_cpu's.
at::Tensor assign_cache_slots_gpu(const CacheSlots& cache, const at::Tensor& table,
                                  const at::Tensor& state, const at::Tensor& ids, int64_t now, bool for_update,
                                  const char* op);
// The weights of each id, from its slot or the host: (ids, dim) on the cache's GPU.
at::Tensor read_cached_rows_gpu(const CacheSlots& cache, const at::Tensor& table,
                                const at::Tensor& state, const at::Tensor& ids, const at::Tensor& slot_of,
                                const char* op);
// The optimizer step on distinct `rows` with their summed gradients: on the slots, or on the host rows for those
// without one.
void step_cached_rows_gpu(const at::Tensor& slot_rows, const at::Tensor& slot_state,
                          const at::Tensor& table, const at::Tensor& state, const at::Tensor& rows,
                          const at::Tensor& slot_of, const at::Tensor& grads, const OptimizerHyper& hyper,
                          int64_t global_step, const char* op);
// Sums duplicates' gradients as the host path does: (sorted distinct rows, their float32 gradient sums) on the GPU.
std::pair<at::Tensor, at::Tensor> sum_duplicates_gpu(const at::Tensor& ids, const at::Tensor& grad);
// Writes dirty slots back (and empties them with `empty`), then waits until the host rows are written.
void flush_cache_gpu(std::optional<c10::Stream>& last_stream, const CacheSlots& cache, const at::Tensor& table,
                     const at::Tensor& state,
                     bool empty, const CacheTensors& slots, const char* op);
// Blocks until the cache's previous call has finished on the GPU.
void wait_for_cache_gpu(const std::optional<c10::Stream>& last_stream);

// The [hits, misses] counted in `lookups` (device memory) since the last call, which zeroes them; waits for the
// cache's previous call.
std::array<int64_t, 2> take_lookup_counts_gpu(const std::optional<c10::Stream>& last_stream, at::Tensor& lookups);

}  // namespace speedtorch

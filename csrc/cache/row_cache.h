// RowCache: copies of a pinned host table's recently used rows, with their optimizer state, in the memory of one
// device (a GPU, or the CPU), in front of the host table: what FBGEMM's LRU cache does for its UVM tables.
//
// A gather finds each id's slot (set-associative, 32 ways, least recently used eviction; one kernel, a warp per id
// holding its set's lock; no sort, no wait for the GPU), fills the misses' weights from the host table over UVA
// (writing the evicted rows back first when dirty), then reads the rows from the slots. A row's optimizer state comes
// in at its first update. An optimizer step updates the cached rows in device memory with the same fused kernel and the
// same table-wide step count as the host path, so every row gets bit for bit the update it would get on the host; the
// slots become dirty and reach the host table when evicted or flushed. A row whose set holds only rows of the current
// call (more distinct ids of one set than ways) is read and updated on the host instead.
//
// The host table is exact only after flush(): the owner (embedding/pinned_embedding.h) flushes before anything
// reads the host rows and empties the cache before anything writes them. Calls are serialised by the cache's own
// mutex; on a GPU, each call's work is ordered after the previous call's on whatever stream that ran.
//
// The operations take the host table (weights, and the optimizer state or an undefined tensor) at each call: the
// cache holds no reference to it, only copies of rows. The state's width must stay the one the cache was built for.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "core/row_cache_slots.h"
#include "core/row_optimizer_math.h"

namespace speedtorch {

class RowCache {
 public:
  static constexpr int64_t kWays = 32;

  // A cache of at least `num_rows` slots (rounded up to whole sets of kWays; fewer ways when num_rows < kWays) on
  // `device` for rows shaped like `table`'s (2-D, rows contiguous) and state rows like `state`'s (undefined: none).
  RowCache(int64_t num_rows, at::Device device, const at::Tensor& table, const at::Tensor& state);
  // Folds the lookups still counted in the cache's memory into the library counters (metrics/transfer_counters.h).
  ~RowCache();
  RowCache(const RowCache&) = delete;
  RowCache& operator=(const RowCache&) = delete;

  int64_t slots() const { return sets_ * ways_; }
  at::Device device() const { return device_; }
  // Whether the cache fits `state` (a layout change needs a new cache).
  bool fits(const at::Tensor& table, const at::Tensor& state) const;

  // The rows of `indices` (any shape, int32/int64, any device; checked), shaped indices.shape + (dim,), on `device`
  // if given, else on the indices' device. The rows become cached.
  at::Tensor gather(const at::Tensor& table, const at::Tensor& state, const at::Tensor& indices,
                    std::optional<at::Device> device, const char* op);
  // apply_row_optimizer (optim/row_optimizer.h) on the cached copies: duplicates summed, one update per distinct
  // row with `global_step` as the table-wide step.
  void apply_gradients(const at::Tensor& table, const at::Tensor& state, const at::Tensor& indices,
                       const at::Tensor& grad, const OptimizerHyper& hyper, int64_t global_step, const char* op);
  // Writes every dirty slot back to the host table; with `empty`, also forgets every row (for host writes). Returns
  // once the host rows are written (the GPU's write-back is waited for).
  void flush(const at::Tensor& table, const at::Tensor& state, bool empty);
  // How many slots hold a row (for tests and statistics; waits for the GPU).
  int64_t cached_rows();

 private:
  CacheSlots view();
  // Adds the lookups counted since the last fold to the library counters (waits for the cache's GPU work).
  void fold_counts();
  void check_table(const at::Tensor& table, const at::Tensor& state, const char* op) const;

  at::Device device_;
  int64_t sets_ = 0;
  int64_t ways_ = 0;
  int64_t tick_ = 0;  // the current call's tick: each call's slots carry it
  at::Tensor ids_, ticks_, dirty_, state_loaded_, set_locks_, rows_, state_;
  std::optional<c10::Stream> last_stream_;  // on a GPU: the stream of the previous call
  at::Tensor lookups_;                       // [hits, misses] of gathers since the last fold, in the cache's memory
  int64_t fold_handle_ = -1;
  std::mutex mutex_;
};

}  // namespace speedtorch

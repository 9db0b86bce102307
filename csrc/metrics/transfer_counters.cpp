// The counters of transfer_counters.h: one array of relaxed atomics and the table of their names and meanings.
//
// Relaxed: a counter orders nothing, it only has to lose no increment. Each call adds to a handful of counters
// (not one per row): about 8 ns per call, 20 ns when two threads count at once, against 3-5 us for the cheapest
// call (bench/RESULTS.md, bench/metrics_counter_cost.cpp). Per-thread shards would only save part of those 20 ns,
// so the counters are one shared array.
#include "metrics/transfer_counters.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <map>
#include <mutex>

namespace speedtorch::metrics {
namespace {

struct CounterInfo {
  Counter counter;
  const char* name;
  const char* help;
};

constexpr int kNumCounters = static_cast<int>(Counter::kCount);

// The one table of counters: names as speedtorch.stats() and GET /metrics show them (docs/metrics.md).
constexpr std::array<CounterInfo, kNumCounters> kCounterInfo{{
    {Counter::kGatherCalls, "gather_calls", "Gather calls that moved at least one row"},
    {Counter::kScatterCalls, "scatter_calls", "Scatter calls that moved at least one row"},
    {Counter::kCpuGatherRows, "cpu_gather_rows", "Rows gathered by CPU threads from a host table to host memory"},
    {Counter::kCpuGatherBytes, "cpu_gather_bytes", "Bytes gathered by CPU threads from a host table to host memory"},
    {Counter::kCpuScatterRows, "cpu_scatter_rows", "Rows scattered by CPU threads from host memory to a host table"},
    {Counter::kCpuScatterBytes, "cpu_scatter_bytes",
     "Bytes scattered by CPU threads from host memory to a host table"},
    {Counter::kUvaGatherRows, "uva_gather_rows", "Rows a GPU kernel read from a pinned host table over UVA"},
    {Counter::kUvaGatherBytes, "uva_gather_bytes", "Bytes a GPU kernel read from a pinned host table over UVA"},
    {Counter::kUvaScatterRows, "uva_scatter_rows", "Rows a GPU kernel wrote to a pinned host table over UVA"},
    {Counter::kUvaScatterBytes, "uva_scatter_bytes", "Bytes a GPU kernel wrote to a pinned host table over UVA"},
    {Counter::kStagedGatherRows, "staged_gather_rows",
     "Rows moved from a pinned host table to a GPU through the staging ring"},
    {Counter::kStagedGatherBytes, "staged_gather_bytes",
     "Bytes moved from a pinned host table to a GPU through the staging ring"},
    {Counter::kStagedScatterRows, "staged_scatter_rows",
     "Rows moved from a GPU to a pinned host table through the staging ring"},
    {Counter::kStagedScatterBytes, "staged_scatter_bytes",
     "Bytes moved from a GPU to a pinned host table through the staging ring"},
    {Counter::kGpuTableGatherRows, "gpu_table_gather_rows", "Rows gathered from a table in GPU memory"},
    {Counter::kGpuTableGatherBytes, "gpu_table_gather_bytes", "Bytes gathered from a table in GPU memory"},
    {Counter::kGpuTableScatterRows, "gpu_table_scatter_rows", "Rows scattered into a table in GPU memory"},
    {Counter::kGpuTableScatterBytes, "gpu_table_scatter_bytes", "Bytes scattered into a table in GPU memory"},
    {Counter::kOptimizerSteps, "optimizer_steps", "Fused optimizer steps that updated at least one row"},
    {Counter::kOptimizerIndexRows, "optimizer_index_rows", "Indices given to optimizer steps, duplicates included"},
    {Counter::kOptimizerRowsUpdated, "optimizer_rows_updated",
     "Distinct rows updated by optimizer steps (after de-duplication)"},
    {Counter::kOptimizerCpuRows, "optimizer_cpu_rows", "Distinct rows updated by CPU threads"},
    {Counter::kOptimizerUvaRows, "optimizer_uva_rows", "Distinct rows of pinned host tables updated by a GPU over UVA"},
    {Counter::kOptimizerGpuTableRows, "optimizer_gpu_table_rows", "Distinct rows of GPU-resident tables updated"},
    {Counter::kCacheHits, "cache_hits",
     "Row lookups of gathers served by a row cache (PinnedEmbedding.enable_cache / placement='hybrid', or a "
     "placement.HybridTable's device-resident rows)"},
    {Counter::kCacheMisses, "cache_misses", "Row lookups of gathers a row cache did not hold (read from the host)"},
    {Counter::kStreamOrderedGatherMicroseconds, "stream_ordered_gather_microseconds",
     "Microseconds CPU threads spent gathering rows into staging in stream order (host functions)"},
    {Counter::kStreamOrderedScatterMicroseconds, "stream_ordered_scatter_microseconds",
     "Microseconds CPU threads spent writing rows from staging in stream order (host functions)"},
}};

constexpr bool table_in_enum_order() {
  for (int i = 0; i < kNumCounters; ++i) {
    if (static_cast<int>(kCounterInfo[i].counter) != i) return false;
  }
  return true;
}
static_assert(table_in_enum_order(), "kCounterInfo must list every Counter once, in enum order");

// Each counter on its own cache line: concurrent calls that add to different counters do not contend.
struct alignas(64) Slot {
  std::atomic<int64_t> value{0};
};
std::array<Slot, kNumCounters> g_counters;
std::atomic<bool> g_enabled{true};

void add(Counter counter, int64_t amount) {
  g_counters[static_cast<int>(counter)].value.fetch_add(amount, std::memory_order_relaxed);
}

bool on() { return g_enabled.load(std::memory_order_relaxed); }

// Counter of (path, direction) rows; the bytes counter follows it in the enum.
Counter rows_counter(TransferPath path, Direction direction) {
  const bool gather = direction == Direction::kGather;
  switch (path) {
    case TransferPath::kCpu: return gather ? Counter::kCpuGatherRows : Counter::kCpuScatterRows;
    case TransferPath::kUva: return gather ? Counter::kUvaGatherRows : Counter::kUvaScatterRows;
    case TransferPath::kStaged: return gather ? Counter::kStagedGatherRows : Counter::kStagedScatterRows;
    case TransferPath::kGpuTable: return gather ? Counter::kGpuTableGatherRows : Counter::kGpuTableScatterRows;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown transfer path");
}

Counter bytes_counter(Counter rows) { return static_cast<Counter>(static_cast<int>(rows) + 1); }

}  // namespace

void add_transfer_call(Direction direction) {
  if (!on()) return;
  add(direction == Direction::kGather ? Counter::kGatherCalls : Counter::kScatterCalls, 1);
}

void add_rows_moved(TransferPath path, Direction direction, int64_t rows, int64_t row_bytes) {
  if (!on() || rows == 0) return;
  const Counter r = rows_counter(path, direction);
  add(r, rows);
  add(bytes_counter(r), rows * row_bytes);
}

void add_optimizer_step(int64_t index_rows, int64_t distinct_rows) {
  if (!on()) return;
  add(Counter::kOptimizerSteps, 1);
  add(Counter::kOptimizerIndexRows, index_rows);
  add(Counter::kOptimizerRowsUpdated, distinct_rows);
}

void add_optimizer_rows(OptimizerRoute route, int64_t rows) {
  if (!on() || rows == 0) return;
  switch (route) {
    case OptimizerRoute::kCpu: return add(Counter::kOptimizerCpuRows, rows);
    case OptimizerRoute::kUva: return add(Counter::kOptimizerUvaRows, rows);
    case OptimizerRoute::kGpuTable: return add(Counter::kOptimizerGpuTableRows, rows);
  }
}

void add_cache_lookups(int64_t hits, int64_t misses) {
  TORCH_CHECK(hits >= 0 && misses >= 0, "speedtorch metrics: cache hits and misses must be >= 0, got hits=", hits,
              ", misses=", misses);
  if (!on()) return;
  if (hits) add(Counter::kCacheHits, hits);
  if (misses) add(Counter::kCacheMisses, misses);
}

void add_stream_ordered_copy_time(Direction direction, int64_t microseconds) {
  if (!on() || microseconds <= 0) return;
  add(direction == Direction::kGather ? Counter::kStreamOrderedGatherMicroseconds
                                      : Counter::kStreamOrderedScatterMicroseconds,
      microseconds);
}

namespace {

struct Folds {
  std::mutex mutex;
  int64_t next = 0;
  std::map<int64_t, std::function<void()>> by_handle;
};

Folds& folds() {
  static Folds* f = new Folds();  // never destroyed: caches may be dropped during static destruction
  return *f;
}

void run_folds() {
  Folds& f = folds();
  std::lock_guard<std::mutex> lock(f.mutex);
  for (auto& [handle, fold] : f.by_handle) {
    // One source that cannot be read (e.g. a GPU whose context a failed kernel broke) must not stop every later
    // read of the counters: its counts stay where they are.
    try {
      fold();
    } catch (const std::exception& e) {
      TORCH_WARN("speedtorch metrics: a row cache's lookup counts could not be read and are left out: ", e.what());
    }
  }
}

}  // namespace

int64_t add_counter_fold(std::function<void()> fold) {
  Folds& f = folds();
  std::lock_guard<std::mutex> lock(f.mutex);
  const int64_t handle = f.next++;
  f.by_handle.emplace(handle, std::move(fold));
  return handle;
}

void remove_counter_fold(int64_t handle) {
  Folds& f = folds();
  std::lock_guard<std::mutex> lock(f.mutex);
  f.by_handle.erase(handle);
}

std::vector<CounterValue> snapshot() {
  run_folds();
  std::vector<CounterValue> out;
  out.reserve(kNumCounters);
  for (const CounterInfo& info : kCounterInfo) {
    out.push_back({info.name, info.help, g_counters[static_cast<int>(info.counter)].value.load(std::memory_order_relaxed)});
  }
  return out;
}

int64_t value(Counter counter) {
  const int i = static_cast<int>(counter);
  TORCH_CHECK(i >= 0 && i < kNumCounters, "speedtorch metrics: no counter number ", i);
  run_folds();
  return g_counters[i].value.load(std::memory_order_relaxed);
}

void reset() {
  run_folds();  // counts still pending elsewhere belong to before the reset
  for (Slot& slot : g_counters) slot.value.store(0, std::memory_order_relaxed);
}

void set_enabled(bool enabled) { g_enabled.store(enabled, std::memory_order_relaxed); }

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

}  // namespace speedtorch::metrics

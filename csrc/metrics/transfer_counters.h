// The library's counters: rows and bytes moved per transfer path, optimizer rows updated per route, and row-cache
// lookups. One process-wide set, always on (a few relaxed atomic adds per call, not per row: about 8 ns a call,
// bench/RESULTS.md), read by speedtorch.stats() (ops/metrics_ops.cpp) and by the example server's GET /metrics
// (torchscript_examples/).
//
// Each counter is incremented in the one place that decides its path (transfer/row_transfer*.cpp,
// optim/row_optimizer*.cpp), once per call, on the host, when the work is issued: GPU work a call enqueues is
// counted before it runs, and a CUDA graph replay (which skips the host) is not counted again.
//
// A snapshot reads each counter atomically but not all of them at one instant: counters incremented together by a
// call running concurrently may be seen one updated and the other not yet.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace speedtorch::metrics {

// Every counter, in the order of kCounterInfo (transfer_counters.cpp).
enum class Counter : int {
  kGatherCalls,
  kScatterCalls,
  kCpuGatherRows,
  kCpuGatherBytes,
  kCpuScatterRows,
  kCpuScatterBytes,
  kUvaGatherRows,
  kUvaGatherBytes,
  kUvaScatterRows,
  kUvaScatterBytes,
  kStagedGatherRows,
  kStagedGatherBytes,
  kStagedScatterRows,
  kStagedScatterBytes,
  kGpuTableGatherRows,
  kGpuTableGatherBytes,
  kGpuTableScatterRows,
  kGpuTableScatterBytes,
  kOptimizerSteps,
  kOptimizerIndexRows,
  kOptimizerRowsUpdated,
  kOptimizerCpuRows,
  kOptimizerUvaRows,
  kOptimizerGpuTableRows,
  kCacheHits,
  kCacheMisses,
  kStreamOrderedGatherMicroseconds,
  kStreamOrderedScatterMicroseconds,
  kCount  // not a counter: how many there are
};

// Who moves a row between a table and a dense block of rows (transfer/row_transfer.h).
enum class TransferPath { kCpu, kUva, kStaged, kGpuTable };
enum class Direction { kGather, kScatter };
// Who updates a row in an optimizer step (optim/row_optimizer.h): CPU threads, a GPU kernel over UVA (pinned host
// table), or a GPU kernel over device memory (table on the GPU).
enum class OptimizerRoute { kCpu, kUva, kGpuTable };

// One gather or scatter call that moves rows (empty calls are not counted).
void add_transfer_call(Direction direction);
// `rows` index positions of one call served by `path`, each `row_bytes` long.
void add_rows_moved(TransferPath path, Direction direction, int64_t rows, int64_t row_bytes);
// One optimizer step: `index_rows` indices given, `distinct_rows` rows updated after de-duplication.
void add_optimizer_step(int64_t index_rows, int64_t distinct_rows);
// `rows` of a step's distinct rows updated by `route`.
void add_optimizer_rows(OptimizerRoute route, int64_t rows);
// Lookups in a GPU-side row cache (or a hybrid table's device-resident rows): found there, or not.
void add_cache_lookups(int64_t hits, int64_t misses);
// Time the CPU threads of one stream-ordered copy took (transfer/stream_ordered_staging.h), counted when the copy has
// run (a host function in a stream), not when it was issued: with the staged counters' bytes, their rate.
void add_stream_ordered_copy_time(Direction direction, int64_t microseconds);

// Counts kept elsewhere until the counters are read: a row cache on a GPU counts its lookups in device memory (its
// kernel decides hits; reading them per call would wait for the GPU). `fold` adds them with the functions above;
// snapshot(), value() and reset() call every registered fold first. Returns a handle for remove_counter_fold, which
// waits for a fold in progress.
int64_t add_counter_fold(std::function<void()> fold);
void remove_counter_fold(int64_t handle);

struct CounterValue {
  const char* name;  // snake_case, e.g. "uva_gather_bytes" (Prometheus: speedtorch_<name>_total)
  const char* help;  // one line: what it counts
  int64_t value;
};

// Every counter's current value, in Counter order.
std::vector<CounterValue> snapshot();
int64_t value(Counter counter);
// Sets every counter to zero.
void reset();

// Off: increments are skipped (for measuring their cost; on by default). Values already counted are kept.
void set_enabled(bool enabled);
bool enabled();

}  // namespace speedtorch::metrics

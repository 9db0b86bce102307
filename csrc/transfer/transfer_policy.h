// How a host<->GPU row transfer is split between its two paths.
//
// UVA (a GPU kernel reads or writes the mapped host rows) needs no CPU, but its rate falls from ~93% of the link to
// ~35% once the rows touched are spread over more host memory than the GPU can translate quickly (bench/BASELINES.md).
// Staged (CPU threads copy rows through a pinned staging buffer while the copy engine moves the previous chunk) is
// bound by the CPU threads. Running both at once on disjoint shares of the rows adds their rates up to the link's.
// The plan gives each path the share that makes both finish together, from the table footprint, the row size, the
// transfer size and the CPU threads; every setting can be overridden: for the process (set_transfer_config, or the
// environment variables named in for_each_transfer_option, read once at first use), for one thread until removed
// (push_thread_transfer_overrides: Python's speedtorch.transfer_config_override), and for one table
// (TransferConfigScope: PinnedEmbedding's own settings, in force during its transfers and steps).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace speedtorch {

struct TransferConfig {
  // Share of rows given to the UVA path; < 0 chooses automatically. SPEEDTORCH_UVA_FRACTION.
  double uva_fraction = -1.0;
  // Tables up to this footprint stay within fast GPU translation: all rows go over UVA.
  // SPEEDTORCH_UVA_REACH_BYTES.
  int64_t uva_reach_bytes = int64_t{512} << 20;
  // Transfers up to this size go over UVA alone: the staged path's fixed costs would dominate.
  // SPEEDTORCH_SMALL_TRANSFER_BYTES.
  int64_t small_transfer_bytes = int64_t{2} << 20;
  // Rows at least this long are translated once per row anyway: UVA alone is fast. SPEEDTORCH_UVA_ROW_BYTES.
  int64_t uva_row_bytes = 4096;
  // Bytes per staging chunk (three chunks per transfer in flight). SPEEDTORCH_STAGING_CHUNK_BYTES.
  int64_t staging_chunk_bytes = int64_t{8} << 20;
  // Sort the UVA share's indices (on the GPU) when the table is past the UVA reach: warps running together then
  // touch nearby host pages, which roughly doubles the UVA rate over a spread-out table (bench/RESULTS.md).
  // SPEEDTORCH_SORT_UVA_INDICES (0 or 1).
  bool sort_uva_indices = true;
  // The sort orders rows by buckets of this many bytes of table and leaves each bucket's rows in batch order (fewer
  // radix passes); 1 sorts by row. 256 KiB: 0.73 of memcpy for a gather over 5 GB where 2 MiB gave 0.66 and a full
  // sort (one more pass) 0.70 (bench/RESULTS.md, issue 23). SPEEDTORCH_UVA_SORT_BUCKET_BYTES.
  int64_t uva_sort_bucket_bytes = int64_t{256} << 10;
  // Resident blocks per SM for UVA kernels (256 threads each). One keeps ~0.5 MB in flight, plenty for the link,
  // and with sorted rows the narrowest window of host pages: fastest on the H100 (bench/RESULTS.md).
  // SPEEDTORCH_UVA_BLOCKS_PER_SM.
  int64_t uva_blocks_per_sm = 1;
  // Rows each group of lanes of a UVA kernel keeps in flight (1, 2, 4 or 8; the fused step takes at most 4): over
  // PCIe the bytes outstanding set the rate (bench/RESULTS.md, issue 23). SPEEDTORCH_UVA_ROWS_IN_FLIGHT.
  int64_t uva_rows_in_flight = 4;
  // The compute budget of a transfer: the row kernels (gather, scatter_, the fused step, the row cache's) run on at
  // most this many SMs, so that a prefetch on a side stream leaves the rest to the model's kernels; 0: all SMs.
  // SPEEDTORCH_MAX_SMS.
  int64_t max_sms = 0;
  // Measure the split at the first transfer of each kind of call instead of taking it from the rates below
  // (split_calibration.h). SPEEDTORCH_CALIBRATE_SPLIT (0 or 1).
  bool calibrate_split = true;
  // Pinned<->GPU transfers go all through staging, with the CPU threads' copies at their place in the caller's stream
  // (a host function handing them to helper threads) and the copy engines moving the rows: no SM taken from the
  // kernels beside them, and the calling thread only enqueues (transfer/stream_ordered_staging.h). uva_fraction is
  // not consulted then. Not under CUDA graph capture nor for pageable tables (the usual routes serve those).
  // SPEEDTORCH_STREAM_ORDERED_STAGING (0 or 1).
  bool stream_ordered_staging = false;
  // CPU threads each stream-ordered copy takes; 0: torch's intra-op threads where the copy is asked for. Fewer
  // leave cores to other work, at a cost: a pipelined DLRM step on an H200's 16 cores ran 1.63x the all-GPU step
  // with 4, 1.17x with 8, 1.10-1.12x with 12-16 (bench/RESULTS.md). SPEEDTORCH_STREAM_ORDERED_THREADS.
  int64_t stream_ordered_threads = 0;
  // The fused optimizer's GPU kernel reads and writes 4 values per access where rows are aligned for it; false
  // forces the scalar kernel (for comparisons, bench/experiments/fused_step_variants.py). SPEEDTORCH_OPTIMIZER_VEC4
  // (0 or 1).
  bool optimizer_vec4 = true;
  // Rates (GB/s) of the (sorted) UVA path over a spread-out table and of one CPU thread on the staged path, and
  // the staged path's ceiling: the model of the split where it is not measured (calibrate_split off, CUDA graph
  // capture, deferred index checks before a measurement). Measured on an H100 PCIe Gen5 host (bench/RESULTS.md,
  // runs 36-38: the staged path alone reached 29-35 GB/s with 16 threads, 7-10 GB/s with 2).
  double uva_spread_gbps = 34.5;
  double staged_gbps_per_thread = 1.9;
  double staged_max_gbps = 31.0;
};

// The one table of the settings by name: calls visit(name, environment variable, &TransferConfig::field) for each.
// The setter and getter ops, their list of names (Python's speedtorch.transfer_config) and the environment reader
// all go through it, so a new field needs one line here.
template <typename Visit>
void for_each_transfer_option(Visit&& visit) {
  visit("uva_fraction", "SPEEDTORCH_UVA_FRACTION", &TransferConfig::uva_fraction);
  visit("uva_reach_bytes", "SPEEDTORCH_UVA_REACH_BYTES", &TransferConfig::uva_reach_bytes);
  visit("small_transfer_bytes", "SPEEDTORCH_SMALL_TRANSFER_BYTES", &TransferConfig::small_transfer_bytes);
  visit("uva_row_bytes", "SPEEDTORCH_UVA_ROW_BYTES", &TransferConfig::uva_row_bytes);
  visit("staging_chunk_bytes", "SPEEDTORCH_STAGING_CHUNK_BYTES", &TransferConfig::staging_chunk_bytes);
  visit("sort_uva_indices", "SPEEDTORCH_SORT_UVA_INDICES", &TransferConfig::sort_uva_indices);
  visit("uva_sort_bucket_bytes", "SPEEDTORCH_UVA_SORT_BUCKET_BYTES", &TransferConfig::uva_sort_bucket_bytes);
  visit("uva_blocks_per_sm", "SPEEDTORCH_UVA_BLOCKS_PER_SM", &TransferConfig::uva_blocks_per_sm);
  visit("uva_rows_in_flight", "SPEEDTORCH_UVA_ROWS_IN_FLIGHT", &TransferConfig::uva_rows_in_flight);
  visit("max_sms", "SPEEDTORCH_MAX_SMS", &TransferConfig::max_sms);
  visit("calibrate_split", "SPEEDTORCH_CALIBRATE_SPLIT", &TransferConfig::calibrate_split);
  visit("optimizer_vec4", "SPEEDTORCH_OPTIMIZER_VEC4", &TransferConfig::optimizer_vec4);
  visit("stream_ordered_staging", "SPEEDTORCH_STREAM_ORDERED_STAGING", &TransferConfig::stream_ordered_staging);
  visit("stream_ordered_threads", "SPEEDTORCH_STREAM_ORDERED_THREADS", &TransferConfig::stream_ordered_threads);
  visit("uva_spread_gbps", "SPEEDTORCH_UVA_SPREAD_GBPS", &TransferConfig::uva_spread_gbps);
  visit("staged_gbps_per_thread", "SPEEDTORCH_STAGED_GBPS_PER_THREAD", &TransferConfig::staged_gbps_per_thread);
  visit("staged_max_gbps", "SPEEDTORCH_STAGED_MAX_GBPS", &TransferConfig::staged_max_gbps);
}

struct TransferPlan {
  int64_t uva_rows = 0;     // positions [0, uva_rows) go over UVA
  int64_t staged_rows = 0;  // positions [uva_rows, count) go through staging
};

// The settings in force on this thread: the innermost TransferConfigScope's, else the process's with this thread's
// overrides (push_thread_transfer_overrides) applied. Every transfer and optimizer step plans with these.
TransferConfig transfer_config();
// The process's settings, and their setter (validated; every thread sees them, except where its own overrides or a
// scope set a value).
TransferConfig process_transfer_config();
void set_transfer_config(const TransferConfig& config);

// Settings by name, as for_each_transfer_option names them. Unknown names throw, listing the known ones; `who` names
// the caller in the message.
std::vector<std::string> transfer_option_names();
void set_transfer_option(TransferConfig& config, const std::string& name, double value, const char* who);
double get_transfer_option(const TransferConfig& config, const std::string& name, const char* who);

// Some settings by name (a table's own), applied over whatever settings are in force.
using TransferOverrides = std::map<std::string, double>;
// `base` with `overrides` applied, validated.
TransferConfig with_overrides(TransferConfig base, const TransferOverrides& overrides, const char* who);

// Settings for the calling thread only: from now until pop_thread_transfer_overrides(id) on this thread,
// transfer_config() here returns the process's settings (as they are at each call) with `overrides` applied, and
// those of every other entry of this thread, oldest first. Entries may be removed in any order; the others stay in
// force. Validated here (unknown names and bad values throw, naming `who`); returns the entry's id. Other threads
// never see them: blocks of several threads cannot leak into each other, whatever order they end in.
int64_t push_thread_transfer_overrides(const TransferOverrides& overrides, const char* who);
// Removes the entry `id` of this thread; throws (naming `who`) when this thread holds none: removed already, or
// pushed on another thread.
void pop_thread_transfer_overrides(int64_t id, const char* who);

// While it lives, transfer_config() on this thread returns the settings in force before it with `overrides` applied
// (a table's own settings for the length of one of its calls). Scopes nest; with no overrides it changes nothing.
// Thread-local, so one table's settings never leak into another thread's transfers.
class TransferConfigScope {
 public:
  TransferConfigScope(const TransferOverrides& overrides, const char* who);
  ~TransferConfigScope();
  TransferConfigScope(const TransferConfigScope&) = delete;
  TransferConfigScope& operator=(const TransferConfigScope&) = delete;

 private:
  TransferConfig config_;
  const TransferConfig* previous_ = nullptr;
  bool active_ = false;
};

// The UVA share the rules fix without measuring anything: an explicit uva_fraction, or UVA alone where the staged
// path cannot pay for its fixed costs (transfers up to small_transfer_bytes, rows of uva_row_bytes or more).
// Nothing when the split is worth measuring (split_calibration.h).
std::optional<double> fixed_uva_share(const TransferConfig& config, int64_t row_bytes, int64_t count);

// `count` rows split with `uva_share` of them over UVA.
TransferPlan plan_from_share(double uva_share, int64_t count);

// The split of `count` rows of `row_bytes` over a table footprint of `table_bytes` by the rules and the model's
// rates, for gathers and scatters alike: the config holds one set of rates, so the direction could not change it.
TransferPlan plan_transfer(const TransferConfig& config, int64_t table_bytes, int64_t row_bytes, int64_t count,
                           int threads);

// Bytes per staging chunk for rows of `row_bytes`: the configured size, or one row where a row is longer, so that a
// chunk always holds at least one whole row.
int64_t staging_chunk_bytes_for(const TransferConfig& config, int64_t row_bytes);

}  // namespace speedtorch

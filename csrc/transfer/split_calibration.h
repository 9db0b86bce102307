// The UVA share of a pinned<->GPU transfer, measured on the machine instead of assumed.
//
// Which split between the UVA kernel and CPU staging is fastest depends on the GPU, the host's memory and PCIe,
// the CPU threads free, the table's footprint, the row size and the batch: rates set once from one machine
// (transfer_policy.h's model) made the automatic split slower than either path alone on the H100 (issue 23). So
// the first transfer of each kind of call times the candidate shares on the call's own rows (a gather reads them
// again into its output; a scatter_ writes the same rows again, which leaves the table as one write would) and
// keeps the fastest for the process. Later calls of the same kind use it.
//
// A measurement can go stale: the staged share may run slower later than when the split was measured (other work
// on the CPU's cores, a thread the scheduler runs late; issue 30 item 4: an `auto` gather at 16 threads took 24 ms,
// 14x its 1.7 ms of earlier in the process, where UVA alone would have taken ~1.6 ms, cause not yet found). So the
// calls that stage a share keep being timed, the same way the calibration timed them (the transfer on the caller's
// stream, the host's part included), and a guard gives UVA back rows when they lose: once the median of a kind's
// last calls is slower than the calibration's time for UVA alone, the share moves to the next larger candidate, or
// straight to UVA alone when those calls took over 1.5x UVA alone's time. A share only grows: a split never
// returns once it lost; clear_split_calibrations() (speedtorch.clear_transfer_calibrations()) measures again.
//
// This file holds the cache and the search; the transfer engine (row_transfer_cuda.cpp) supplies the timing. Plain
// C++: tested without a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "transfer/transfer_policy.h"

namespace speedtorch {

enum class TransferDirection : int32_t { kGather = 0, kScatter = 1 };

// What makes two calls "of the same kind": whatever changes the rates of the two paths.
struct SplitKey {
  int32_t device = 0;
  TransferDirection direction = TransferDirection::kGather;
  bool host_indices = false;    // the staged share needs no copy of the indices back from the GPU
  int32_t footprint_log2 = 0;   // bytes of table the batch spans (page translation)
  int64_t row_bytes = 0;
  int32_t count_log2 = 0;       // rows in the call (fixed costs)
  int32_t threads = 0;          // CPU threads of the staged share
  int64_t uva_blocks_per_sm = 0;
  int64_t uva_rows_in_flight = 0;
  int64_t max_sms = 0;
  int64_t staging_chunk_bytes = 0;

  bool operator<(const SplitKey& other) const;
  bool operator==(const SplitKey& other) const { return !(*this < other) && !(other < *this); }
};

SplitKey split_key(int device, TransferDirection direction, bool host_indices, int64_t footprint_bytes,
                   int64_t row_bytes, int64_t count, int threads, const TransferConfig& config);

// UVA shares tried, in order: all-UVA first (the share every call can take), then ever more staging.
const std::vector<double>& candidate_uva_shares();

struct SplitCalibration {
  SplitKey key;
  double uva_share = 1.0;         // in force: the calibration's choice, or larger once the guard gave UVA rows back
  double calibrated_share = 1.0;  // the calibration's choice
  std::vector<double> shares;     // the candidates tried, and their best times
  std::vector<double> milliseconds;
  std::vector<double> recent_ms;  // the guard's window: the last calls at uva_share, oldest first
};

// The guard's rules (see the top of this file).
constexpr int kSplitGuardWindow = 5;     // calls remembered at the share in force
constexpr int kSplitGuardMinCalls = 3;   // calls needed before the guard judges: one slow call is no trend
constexpr double kSplitCollapse = 1.5;   // calls this much slower than UVA alone: straight to UVA alone

// The share in force for calls like `key` (the measurement's, or the guard's), if one was measured.
std::optional<double> calibrated_uva_share(const SplitKey& key);

// Times every candidate `rounds` times with time_ms(share) (one whole transfer with that share, in milliseconds),
// keeps the share with the smallest best time (a split only if it beats all-UVA by 3% or more) and returns it. An exception from time_ms propagates; nothing is kept.
double calibrate_uva_share(const SplitKey& key, const std::function<double(double)>& time_ms, int rounds = 3);

// Reports one call of kind `key` made with `uva_share` < 1 and timed like the calibration's trials (`ms`).
// Applies the guard and returns the share in force afterwards. A report for a share no longer in force (the guard
// moved it meanwhile) or for a kind not measured is ignored.
double note_split_time(const SplitKey& key, double uva_share, double ms);

// Every share measured so far (speedtorch.transfer_calibrations()), and forgetting them (tests; a machine whose
// load changed).
std::vector<SplitCalibration> split_calibrations();
void clear_split_calibrations();

}  // namespace speedtorch

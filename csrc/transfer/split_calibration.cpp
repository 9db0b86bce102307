// The measured split of the transfer engine (see split_calibration.h).
#include "transfer/split_calibration.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

namespace speedtorch {
namespace {

struct Cache {
  std::mutex mutex;
  std::map<SplitKey, SplitCalibration> entries;
};

Cache& cache() {
  static Cache c;
  return c;
}

// A split is kept over all-UVA only when it is at least this much faster (measured spread of the link: ~3%).
constexpr double kStagedMustWinBy = 0.97;

int32_t log2_bucket(int64_t value) {
  return value <= 1 ? 0 : static_cast<int32_t>(std::floor(std::log2(static_cast<double>(value))));
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The share the guard moves to from `current` when calls at it lost to UVA alone: the next larger candidate
// (candidates run from 1.0 down), or UVA alone after a collapse.
double larger_share(double current, bool collapsed) {
  if (collapsed) return 1.0;
  double next = 1.0;
  for (double s : candidate_uva_shares()) {
    if (s > current && s < next) next = s;
  }
  return next;
}

}  // namespace

bool SplitKey::operator<(const SplitKey& o) const {
  return std::tie(device, direction, host_indices, footprint_log2, row_bytes, count_log2, threads, uva_blocks_per_sm,
                  uva_rows_in_flight, max_sms, staging_chunk_bytes) <
         std::tie(o.device, o.direction, o.host_indices, o.footprint_log2, o.row_bytes, o.count_log2, o.threads,
                  o.uva_blocks_per_sm, o.uva_rows_in_flight, o.max_sms, o.staging_chunk_bytes);
}

SplitKey split_key(int device, TransferDirection direction, bool host_indices, int64_t footprint_bytes,
                   int64_t row_bytes, int64_t count, int threads, const TransferConfig& config) {
  SplitKey key;
  key.device = device;
  key.direction = direction;
  key.host_indices = host_indices;
  key.footprint_log2 = log2_bucket(footprint_bytes);
  key.row_bytes = row_bytes;
  key.count_log2 = log2_bucket(count);
  key.threads = threads;
  key.uva_blocks_per_sm = config.uva_blocks_per_sm;
  key.uva_rows_in_flight = config.uva_rows_in_flight;
  key.max_sms = config.max_sms;
  key.staging_chunk_bytes = config.staging_chunk_bytes;
  return key;
}

const std::vector<double>& candidate_uva_shares() {
  static const std::vector<double> shares{1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5};
  return shares;
}

std::optional<double> calibrated_uva_share(const SplitKey& key) {
  std::lock_guard<std::mutex> lock(cache().mutex);
  const auto it = cache().entries.find(key);
  if (it == cache().entries.end()) return std::nullopt;
  return it->second.uva_share;
}

double calibrate_uva_share(const SplitKey& key, const std::function<double(double)>& time_ms, int rounds) {
  TORCH_CHECK(rounds >= 1, "calibrate_uva_share: rounds must be >= 1, got ", rounds);
  const std::vector<double>& shares = candidate_uva_shares();
  std::vector<double> best(shares.size(), std::numeric_limits<double>::infinity());
  // Round-robin, so that a drift of the link during the search falls on every candidate alike. A failure is the
  // call's: nothing is kept.
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < shares.size(); ++i) best[i] = std::min(best[i], time_ms(shares[i]));
  }
  // A staged share must win clearly: it costs CPU threads and host memory bandwidth that the rest of the program
  // may want, and a difference within the link's run-to-run spread is no reason to pay that.
  size_t chosen = 0;
  for (size_t i = 1; i < shares.size(); ++i) {
    if (best[i] < best[chosen] && best[i] < kStagedMustWinBy * best[0]) chosen = i;
  }
  SplitCalibration entry{key, shares[chosen], shares[chosen], shares, best, {}};
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().entries[key] = entry;
  return entry.uva_share;
}

double note_split_time(const SplitKey& key, double uva_share, double ms) {
  std::lock_guard<std::mutex> lock(cache().mutex);
  const auto it = cache().entries.find(key);
  if (it == cache().entries.end()) return 1.0;
  SplitCalibration& entry = it->second;
  if (uva_share != entry.uva_share || entry.uva_share >= 1.0) return entry.uva_share;
  entry.recent_ms.push_back(ms);
  if (entry.recent_ms.size() > static_cast<size_t>(kSplitGuardWindow)) entry.recent_ms.erase(entry.recent_ms.begin());
  if (entry.recent_ms.size() < static_cast<size_t>(kSplitGuardMinCalls)) return entry.uva_share;
  // All-UVA is the first candidate: its best time is what UVA alone took on this kind of call. A split whose
  // calls now take longer than that (the median: one slow call is no trend) has lost what it was kept for.
  const double uva_alone_ms = entry.milliseconds.front();
  const double typical_ms = median(entry.recent_ms);
  if (typical_ms > uva_alone_ms) {
    entry.uva_share = larger_share(entry.uva_share, typical_ms > kSplitCollapse * uva_alone_ms);
    entry.recent_ms.clear();  // the new share is judged on its own calls
  }
  return entry.uva_share;
}

std::vector<SplitCalibration> split_calibrations() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  std::vector<SplitCalibration> out;
  out.reserve(cache().entries.size());
  for (const auto& [key, entry] : cache().entries) out.push_back(entry);
  return out;
}

void clear_split_calibrations() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().entries.clear();
}

}  // namespace speedtorch

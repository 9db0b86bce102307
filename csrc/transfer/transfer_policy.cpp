// The split between the UVA and staged transfer paths (see transfer_policy.h).
#include "transfer/transfer_policy.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>

namespace speedtorch {
namespace {

// The staged path joins only when the CPU threads add at least this share of the UVA rate.
constexpr double kMinStagedShareOfUva = 0.25;

template <typename T>
void read_env(const char* name, T& value) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return;
  char* end = nullptr;
  const double parsed = std::strtod(text, &end);
  TORCH_CHECK(end != text && *end == '\0', "speedtorch: environment variable ", name, "='", text,
              "' is not a number");
  value = static_cast<T>(parsed);
}

void validate(const TransferConfig& c) {
  TORCH_CHECK(c.uva_fraction <= 1.0, "speedtorch: uva_fraction must be in [0, 1] (or negative for automatic), got ",
              c.uva_fraction);
  TORCH_CHECK(c.uva_reach_bytes >= 0, "speedtorch: uva_reach_bytes must be >= 0, got ", c.uva_reach_bytes);
  TORCH_CHECK(c.small_transfer_bytes >= 0, "speedtorch: small_transfer_bytes must be >= 0, got ",
              c.small_transfer_bytes);
  TORCH_CHECK(c.uva_row_bytes > 0, "speedtorch: uva_row_bytes must be > 0, got ", c.uva_row_bytes);
  TORCH_CHECK(c.staging_chunk_bytes >= 4096, "speedtorch: staging_chunk_bytes must be >= 4096, got ",
              c.staging_chunk_bytes);
  TORCH_CHECK(c.uva_blocks_per_sm >= 1, "speedtorch: uva_blocks_per_sm must be >= 1, got ", c.uva_blocks_per_sm);
  TORCH_CHECK(c.uva_spread_gbps > 0 && c.staged_gbps_per_thread > 0 && c.staged_max_gbps > 0,
              "speedtorch: transfer rates must be > 0");
}

struct ConfigHolder {
  std::mutex mutex;
  TransferConfig config;
  ConfigHolder() {
    for_each_transfer_option([&](const char*, const char* env, auto field) { read_env(env, config.*field); });
    validate(config);
  }
};

ConfigHolder& holder() {
  static ConfigHolder h;
  return h;
}

}  // namespace

TransferConfig transfer_config() {
  std::lock_guard<std::mutex> lock(holder().mutex);
  return holder().config;
}

void set_transfer_config(const TransferConfig& config) {
  validate(config);
  std::lock_guard<std::mutex> lock(holder().mutex);
  holder().config = config;
}

TransferPlan plan_transfer(const TransferConfig& c, int64_t table_bytes, int64_t row_bytes, int64_t count,
                           int threads) {
  TransferPlan plan;
  double fraction = c.uva_fraction;
  if (fraction < 0) {
    const int64_t bytes = count * row_bytes;
    if (bytes <= c.small_transfer_bytes || table_bytes <= c.uva_reach_bytes || row_bytes >= c.uva_row_bytes) {
      fraction = 1.0;
    } else {
      // Both paths finish together when each gets rows in proportion to its rate. A few threads add too little to
      // pay for the staged path's fixed costs (on the H100 host 2 threads made the split 15% slower than UVA alone).
      const double staged = std::min(c.staged_max_gbps, c.staged_gbps_per_thread * std::max(threads, 1));
      fraction = staged < kMinStagedShareOfUva * c.uva_spread_gbps ? 1.0 : c.uva_spread_gbps / (c.uva_spread_gbps + staged);
    }
  }
  plan.uva_rows = std::clamp<int64_t>(static_cast<int64_t>(std::llround(fraction * static_cast<double>(count))), 0,
                                      count);
  plan.staged_rows = count - plan.uva_rows;
  return plan;
}

int64_t staging_chunk_bytes_for(const TransferConfig& config, int64_t row_bytes) {
  return std::max(config.staging_chunk_bytes, row_bytes);
}

}  // namespace speedtorch

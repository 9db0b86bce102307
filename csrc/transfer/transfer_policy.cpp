// The split between the UVA and staged transfer paths (see transfer_policy.h).
#include "transfer/transfer_policy.h"

#include <c10/util/Exception.h>

#include "core/thread_scoped_values.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>

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
  const int64_t r = c.uva_rows_in_flight;
  TORCH_CHECK(r == 1 || r == 2 || r == 4 || r == 8, "speedtorch: uva_rows_in_flight must be 1, 2, 4 or 8, got ", r);
  TORCH_CHECK(c.uva_sort_bucket_bytes >= 1, "speedtorch: uva_sort_bucket_bytes must be >= 1, got ",
              c.uva_sort_bucket_bytes);
  TORCH_CHECK(c.max_sms >= 0, "speedtorch: max_sms must be >= 0 (0: every SM), got ", c.max_sms);
  TORCH_CHECK(c.stream_ordered_threads >= 0 && c.stream_ordered_threads <= 4096,
              "speedtorch: stream_ordered_threads must be in [0, 4096] (0: torch's threads), got ",
              c.stream_ordered_threads);
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

// The innermost TransferConfigScope's settings on this thread, or null.
thread_local const TransferConfig* t_scoped_config = nullptr;
// This thread's overrides (push_thread_transfer_overrides), oldest first.
thread_local ThreadScopedValues<TransferOverrides> t_thread_overrides;

std::string known_option_names() {
  std::string text;
  for (const std::string& name : transfer_option_names()) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// Calls visit(field of `c` named `name`); throws if no field has that name.
template <typename Visit>
void visit_option(TransferConfig& c, const std::string& name, const char* who, Visit&& visit) {
  bool known = false;
  for_each_transfer_option([&](const char* option, const char*, auto field) {
    if (!known && name == option) {
      visit(c.*field);
      known = true;
    }
  });
  TORCH_CHECK(known, who, ": unknown transfer option '", name, "'; known options: ", known_option_names());
}

}  // namespace

TransferConfig transfer_config() {
  if (t_scoped_config != nullptr) return *t_scoped_config;
  TransferConfig config = process_transfer_config();
  for (const auto& entry : t_thread_overrides.entries()) {
    for (const auto& [name, value] : entry.value) set_transfer_option(config, name, value, "speedtorch");
  }
  return config;  // valid: each value was validated when pushed, and every check is of one field alone
}

TransferConfig process_transfer_config() {
  std::lock_guard<std::mutex> lock(holder().mutex);
  return holder().config;
}

void set_transfer_config(const TransferConfig& config) {
  validate(config);
  std::lock_guard<std::mutex> lock(holder().mutex);
  holder().config = config;
}

std::vector<std::string> transfer_option_names() {
  std::vector<std::string> names;
  for_each_transfer_option([&](const char* option, const char*, auto) { names.emplace_back(option); });
  return names;
}

void set_transfer_option(TransferConfig& config, const std::string& name, double value, const char* who) {
  visit_option(config, name, who, [&](auto& field) { field = static_cast<std::remove_reference_t<decltype(field)>>(value); });
}

double get_transfer_option(const TransferConfig& config, const std::string& name, const char* who) {
  TransferConfig copy = config;
  double out = 0;
  visit_option(copy, name, who, [&](auto& field) { out = static_cast<double>(field); });
  return out;
}

TransferConfig with_overrides(TransferConfig base, const TransferOverrides& overrides, const char* who) {
  for (const auto& [name, value] : overrides) set_transfer_option(base, name, value, who);
  validate(base);
  return base;
}

int64_t push_thread_transfer_overrides(const TransferOverrides& overrides, const char* who) {
  with_overrides(transfer_config(), overrides, who);  // refuses unknown names and bad values before anything changes
  return t_thread_overrides.push(overrides);
}

void pop_thread_transfer_overrides(int64_t id, const char* who) {
  TORCH_CHECK(t_thread_overrides.pop(id), who, ": this thread holds no transfer settings with id ", id,
              " (removed already, or set on another thread: a block's settings end on the thread that began it)");
}

TransferConfigScope::TransferConfigScope(const TransferOverrides& overrides, const char* who) {
  if (overrides.empty()) return;
  config_ = with_overrides(transfer_config(), overrides, who);
  previous_ = t_scoped_config;
  t_scoped_config = &config_;
  active_ = true;
}

TransferConfigScope::~TransferConfigScope() {
  if (active_) t_scoped_config = previous_;
}

std::optional<double> fixed_uva_share(const TransferConfig& c, int64_t row_bytes, int64_t count) {
  if (c.uva_fraction >= 0) return c.uva_fraction;
  if (count * row_bytes <= c.small_transfer_bytes || row_bytes >= c.uva_row_bytes) return 1.0;
  return std::nullopt;
}

TransferPlan plan_from_share(double uva_share, int64_t count) {
  TransferPlan plan;
  plan.uva_rows = std::clamp<int64_t>(static_cast<int64_t>(std::llround(uva_share * static_cast<double>(count))), 0,
                                      count);
  plan.staged_rows = count - plan.uva_rows;
  return plan;
}

TransferPlan plan_transfer(const TransferConfig& c, int64_t table_bytes, int64_t row_bytes, int64_t count,
                           int threads) {
  if (const std::optional<double> fixed = fixed_uva_share(c, row_bytes, count)) return plan_from_share(*fixed, count);
  if (table_bytes <= c.uva_reach_bytes) return plan_from_share(1.0, count);
  // Both paths finish together when each gets rows in proportion to its rate. A few threads add too little to pay
  // for the staged path's fixed costs (on the H100 host 2 threads made the split 15% slower than UVA alone).
  const double staged = std::min(c.staged_max_gbps, c.staged_gbps_per_thread * std::max(threads, 1));
  const double share =
      staged < kMinStagedShareOfUva * c.uva_spread_gbps ? 1.0 : c.uva_spread_gbps / (c.uva_spread_gbps + staged);
  return plan_from_share(share, count);
}

int64_t staging_chunk_bytes_for(const TransferConfig& config, int64_t row_bytes) {
  return std::max(config.staging_chunk_bytes, row_bytes);
}

}  // namespace speedtorch

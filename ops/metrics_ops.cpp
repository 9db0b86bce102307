// The library counters (csrc/metrics/transfer_counters.h) as operators: read, reset, switch off (to measure their
// cost), and count lookups in a row cache kept outside C++ (placement.HybridTable).
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "metrics/transfer_counters.h"

namespace speedtorch::ops {
namespace {

std::tuple<std::vector<std::string>, std::vector<int64_t>> stats_op() {
  std::vector<std::string> names;
  std::vector<int64_t> values;
  for (const metrics::CounterValue& c : metrics::snapshot()) {
    names.emplace_back(c.name);
    values.push_back(c.value);
  }
  return {std::move(names), std::move(values)};
}

std::vector<std::string> stats_help_op() {
  std::vector<std::string> help;
  for (const metrics::CounterValue& c : metrics::snapshot()) help.emplace_back(c.help);
  return help;
}

}  // namespace
}  // namespace speedtorch::ops

TORCH_LIBRARY_FRAGMENT(speedtorch, m) {
  m.def("stats() -> (str[], int[])", &speedtorch::ops::stats_op);
  m.def("stats_help() -> str[]", &speedtorch::ops::stats_help_op);
  m.def("reset_stats() -> ()", &speedtorch::metrics::reset);
  m.def("set_stats_enabled(bool enabled) -> ()", &speedtorch::metrics::set_enabled);
  m.def("stats_enabled() -> bool", &speedtorch::metrics::enabled);
  m.def("record_cache_lookups(int hits, int misses) -> ()", &speedtorch::metrics::add_cache_lookups);  // checks its arguments
}

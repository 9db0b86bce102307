// Tests for metrics/transfer_counters: exact increments from the CPU routes of gather, scatter and the optimizer,
// reset, the off switch, and no lost increments under concurrent callers. (Each test runs in its own process under
// ctest; every test starts from reset() anyway.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "metrics/transfer_counters.h"
#include "optim/optimizer_config.h"
#include "optim/row_optimizer.h"
#include "row_ops.h"

namespace speedtorch {
namespace {

using metrics::Counter;

std::map<std::string, int64_t> counters() {
  std::map<std::string, int64_t> out;
  for (const metrics::CounterValue& c : metrics::snapshot()) out[c.name] = c.value;
  return out;
}

// Every counter zero except those named.
void expect_only(const std::map<std::string, int64_t>& expected) {
  for (const auto& [name, value] : counters()) {
    const auto it = expected.find(name);
    EXPECT_EQ(value, it == expected.end() ? 0 : it->second) << name;
  }
}

TEST(TransferCounters, SnapshotNamesEveryCounterOnceWithHelp) {
  const auto all = metrics::snapshot();
  ASSERT_EQ(all.size(), static_cast<size_t>(Counter::kCount));
  std::map<std::string, int> seen;
  for (const auto& c : all) {
    EXPECT_EQ(++seen[c.name], 1) << c.name;
    EXPECT_GT(std::string(c.help).size(), 10u) << c.name;
  }
}

TEST(TransferCounters, CpuGatherAndScatterCountRowsBytesAndCalls) {
  metrics::reset();
  at::Tensor table = at::randn({100, 6});  // 24-byte rows
  ops::gather(table, at::tensor(std::vector<int64_t>{1, 5, 5, 9}));
  ops::gather(table, at::empty({0}, at::kLong));  // empty: not a call that moved rows
  ops::scatter_(table, at::tensor(std::vector<int32_t>{3, 3, 4}), at::randn({3, 6}));
  expect_only({{"gather_calls", 1},
               {"cpu_gather_rows", 4},
               {"cpu_gather_bytes", 4 * 24},
               {"scatter_calls", 1},
               {"cpu_scatter_rows", 3},
               {"cpu_scatter_bytes", 3 * 24}});
}

TEST(TransferCounters, FailedCallsCountNothing) {
  metrics::reset();
  at::Tensor table = at::randn({10, 2});
  EXPECT_THROW(ops::gather(table, at::tensor(std::vector<int64_t>{1, 10})), c10::Error);
  expect_only({});
}

TEST(TransferCounters, CpuOptimizerStepCountsDistinctRows) {
  metrics::reset();
  const int64_t dim = 4;
  at::Tensor weights = at::randn({20, dim});
  at::Tensor state = at::zeros({20, kStateHeaderFloats + 2 * dim});  // adam: two slots per element
  const auto hyper = parse_optimizer("adam", c10::Dict<std::string, double>());
  at::Tensor idx = at::tensor(std::vector<int64_t>{2, 7, 2, 2, 11});
  apply_row_optimizer(weights, state, idx, at::randn({5, dim}), hyper, 1, "test");
  apply_row_optimizer(weights, state, at::tensor(std::vector<int64_t>{0}), at::randn({1, dim}), hyper, 2, "test");
  expect_only({{"optimizer_steps", 2},
               {"optimizer_index_rows", 6},
               {"optimizer_rows_updated", 4},
               {"optimizer_cpu_rows", 4}});
}

TEST(TransferCounters, ResetZeroesAndDisabledCountsNothing) {
  metrics::add_cache_lookups(3, 4);
  metrics::add_rows_moved(metrics::TransferPath::kUva, metrics::Direction::kGather, 10, 8);
  EXPECT_GE(metrics::value(Counter::kUvaGatherBytes), 80);
  metrics::reset();
  expect_only({});
  metrics::set_enabled(false);
  EXPECT_FALSE(metrics::enabled());
  metrics::add_cache_lookups(3, 4);
  ops::gather(at::randn({4, 2}), at::tensor(std::vector<int64_t>{1}));
  metrics::set_enabled(true);
  expect_only({});
  metrics::add_cache_lookups(3, 4);
  expect_only({{"cache_hits", 3}, {"cache_misses", 4}});
  EXPECT_THROW(metrics::add_cache_lookups(-1, 0), c10::Error);
  metrics::reset();
}

TEST(TransferCounters, EachPathAndDirectionHasItsOwnCounters) {
  metrics::reset();
  using metrics::Direction;
  using metrics::TransferPath;
  metrics::add_rows_moved(TransferPath::kStaged, Direction::kScatter, 3, 16);
  metrics::add_rows_moved(TransferPath::kGpuTable, Direction::kGather, 2, 4);
  metrics::add_optimizer_rows(metrics::OptimizerRoute::kUva, 7);
  metrics::add_optimizer_rows(metrics::OptimizerRoute::kGpuTable, 1);
  expect_only({{"staged_scatter_rows", 3},
               {"staged_scatter_bytes", 48},
               {"gpu_table_gather_rows", 2},
               {"gpu_table_gather_bytes", 8},
               {"optimizer_uva_rows", 7},
               {"optimizer_gpu_table_rows", 1}});
  metrics::reset();
}

TEST(TransferCounters, ConcurrentCallersLoseNoIncrement) {
  metrics::reset();
  constexpr int kThreads = 4;
  constexpr int kCalls = 20000;
  at::Tensor table = at::randn({64, 4});
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        metrics::add_rows_moved(metrics::TransferPath::kUva, metrics::Direction::kGather, 2, 8);
        metrics::add_cache_lookups(1, t % 2);
        if (i % 1000 == 0) ops::gather(table, at::tensor(std::vector<int64_t>{i % 64}));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(metrics::value(Counter::kUvaGatherRows), 2 * kThreads * kCalls);
  EXPECT_EQ(metrics::value(Counter::kUvaGatherBytes), 16 * kThreads * kCalls);
  EXPECT_EQ(metrics::value(Counter::kCacheHits), kThreads * kCalls);
  EXPECT_EQ(metrics::value(Counter::kCacheMisses), kThreads / 2 * kCalls);
  EXPECT_EQ(metrics::value(Counter::kGatherCalls), kThreads * kCalls / 1000);
  EXPECT_EQ(metrics::value(Counter::kCpuGatherRows), kThreads * kCalls / 1000);
  metrics::reset();
}

}  // namespace
}  // namespace speedtorch

// Tests for csrc/cache/row_cache (and cpu/row_cache_cpu): the cache on CPU memory in front of a host table gives
// exactly apply_row_optimizer's results on the table itself, through eviction and overflowing sets, and its
// write-back makes the host table exact.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/script.h>

#include <string>

#include "cache/row_cache.h"
#include "embedding/pinned_embedding.h"
#include "error_text.h"
#include "optim/optimizer_config.h"
#include "optim/row_optimizer.h"

namespace speedtorch {
namespace {

using speedtorch::testing::error_of;

struct Table {
  at::Tensor rows, state;
};

Table make_table(int64_t n, int64_t d, const OptimizerHyper& hyper) {
  at::manual_seed(0);
  const int64_t width = (kStateHeaderFloats + state_slots(hyper) * d + 3) / 4 * 4;
  return {at::randn({n, d}), at::zeros({n, width})};
}

TEST(RowCache, SlotsAreWholeSets) {
  const OptimizerHyper hyper = parse_optimizer("sgd", c10::Dict<std::string, double>());
  const Table t = make_table(100, 4, hyper);
  EXPECT_EQ(RowCache(40, at::kCPU, t.rows, t.state).slots(), 64);
  EXPECT_EQ(RowCache(3, at::kCPU, t.rows, t.state).slots(), 3);
  EXPECT_EQ(RowCache(1000, at::kCPU, t.rows, t.state).slots(), 128);  // no more than the table's rows, rounded up
}

TEST(RowCache, StepsEqualTheHostTablesThroughEvictionAndOverflow) {
  c10::Dict<std::string, double> options;
  options.insert("lr", 0.05);
  const OptimizerHyper hyper = parse_optimizer("adam", options);
  const Table host = make_table(200, 8, hyper);
  const Table cached{host.rows.clone(), host.state.clone()};
  RowCache cache(8, at::kCPU, cached.rows, cached.state);  // 8 ways, one set: most rows overflow
  for (int64_t step = 1; step <= 5; ++step) {
    const at::Tensor ids = at::randint(0, 60, {80}, at::kLong);
    const at::Tensor grad = at::randn({80, 8});
    EXPECT_TRUE(at::equal(cache.gather(cached.rows, cached.state, ids, std::nullopt, "test"),
                          host.rows.index_select(0, ids)));
    apply_row_optimizer(host.rows, host.state, ids, grad, hyper, step, "test");
    cache.apply_gradients(cached.rows, cached.state, ids, grad, hyper, step, "test");
  }
  EXPECT_EQ(cache.cached_rows(), 8);
  EXPECT_FALSE(at::equal(cached.rows, host.rows));  // the cached rows' updates have not reached the host yet
  cache.flush(cached.rows, cached.state, false);
  EXPECT_TRUE(at::equal(cached.rows, host.rows));
  EXPECT_TRUE(at::equal(cached.state, host.state));
  EXPECT_EQ(cache.cached_rows(), 8);
  cache.flush(cached.rows, cached.state, true);
  EXPECT_EQ(cache.cached_rows(), 0);
}

TEST(RowCache, ErrorsNameTheArgument) {
  const OptimizerHyper hyper = parse_optimizer("sgd", c10::Dict<std::string, double>());
  const Table t = make_table(10, 4, hyper);
  EXPECT_NE(error_of([&] { RowCache(0, at::kCPU, t.rows, t.state); }).find("num_rows (the cache's rows) must be >= 1"),
            std::string::npos);
  RowCache cache(4, at::kCPU, t.rows, t.state);
  const at::Tensor other_state = at::zeros({10, 8});
  EXPECT_NE(error_of([&] { cache.gather(t.rows, other_state, at::tensor({1}), std::nullopt, "op"); })
                .find("op: the row cache was built for another row or optimizer state layout"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cache.gather(t.rows, t.state, at::tensor({10}), std::nullopt, "op"); }).find("10"),
            std::string::npos);
}

// A TorchScript model run from C++ alone (as the serving example's server runs one) enables and uses the cache.
TEST(RowCache, ScriptedModelsUseItFromCpp) {
  torch::jit::Module m("Model");
  auto table = torch::make_custom_class<PinnedEmbedding>(100, 4, at::kFloat);
  PinnedEmbedding* users = table.toCustomClass<PinnedEmbedding>().get();
  c10::Dict<std::string, double> options;
  options.insert("lr", 0.5);
  users->set_optimizer("sgd", options, true);
  users->normal_(0.0, 1.0, 1);
  m.register_attribute("users", c10::getCustomClassType<c10::intrusive_ptr<PinnedEmbedding>>(), table);
  m.define(R"(
    def cache(self, rows: int) -> int:
        self.users.enable_cache(rows, torch.device("cpu"))
        return self.users.cache_slots()

    def train(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.users.gather(ids, None)
        self.users.apply_gradients(ids, torch.ones_like(rows))
        return rows
  )");
  EXPECT_EQ(m.run_method("cache", 40).toInt(), 64);
  const at::Tensor before = users->table().clone();
  const at::Tensor ids = at::tensor({1, 5, 7}, at::kLong);
  EXPECT_TRUE(at::equal(m.run_method("train", ids).toTensor(), before.index_select(0, ids)));
  EXPECT_EQ(users->cached_rows(), 3);
  EXPECT_TRUE(at::equal(users->table().index_select(0, ids), before.index_select(0, ids) - 0.5));
  EXPECT_EQ(users->cached_rows(), 0);  // table() wrote the cache back and emptied it
}

// While a tensor that table() handed out lives (here only a view of it), the cache stands aside: a write through it
// after a step is what the next gather reads, not a cached copy, and no flush overwrites it. Dropped: cached again.
TEST(RowCache, StandsAsideWhileTheHostRowsAreHandedOut) {
  auto table = c10::make_intrusive<PinnedEmbedding>(100, 4, at::kFloat);
  c10::Dict<std::string, double> options;
  options.insert("lr", 0.5);
  table->set_optimizer("sgd", options, true);
  table->normal_(0.0, 1.0, 1);
  table->enable_cache(32, at::kCPU);
  const at::Tensor ids = at::tensor({1, 5, 7}, at::kLong);
  EXPECT_FALSE(table->host_rows_in_use());
  at::Tensor row5 = table->table().narrow(0, 5, 1);  // the tensor table() returned is gone; its view holds the rows
  EXPECT_TRUE(table->host_rows_in_use());
  table->apply_gradients(ids, at::ones({3, 4}));
  EXPECT_EQ(table->cached_rows(), 0);
  row5.fill_(3.0);
  EXPECT_TRUE(at::equal(table->gather(ids, std::nullopt)[1], at::full({4}, 3.0)));
  row5.reset();
  EXPECT_FALSE(table->host_rows_in_use());
  table->apply_gradients(ids, at::ones({3, 4}));
  EXPECT_EQ(table->cached_rows(), 3);
  EXPECT_TRUE(at::equal(table->table()[5], at::full({4}, 2.5)));  // written back: 3 - 0.5
}

}  // namespace
}  // namespace speedtorch

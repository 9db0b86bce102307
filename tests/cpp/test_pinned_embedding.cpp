// Tests for csrc/embedding/pinned_embedding used from C++ directly and through torch::make_custom_class.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <ATen/record_function.h>
#include <torch/custom_class.h>

#include <memory>
#include <string>
#include <vector>

#include "embedding/pinned_embedding.h"
#include "error_text.h"

namespace speedtorch {
namespace {

using speedtorch::testing::error_of;

TEST(PinnedEmbedding, SizesAndExactBytes) {
  PinnedEmbedding e(1000, 16, at::kBFloat16);
  EXPECT_EQ(e.num_rows(), 1000);
  EXPECT_EQ(e.dim(), 16);
  EXPECT_EQ(e.nbytes(), 1000 * 16 * 2);
  EXPECT_EQ(e.table().scalar_type(), at::kBFloat16);
}

TEST(PinnedEmbedding, SeededInitIsReproducible) {
  PinnedEmbedding e(30000, 4, at::kFloat);
  e.normal_(0.0, 1.0, 123);
  at::Tensor first = e.table().clone();
  e.normal_(0.0, 1.0, 123);
  EXPECT_TRUE(at::equal(first, e.table()));
  e.normal_(0.0, 1.0, 124);
  EXPECT_FALSE(at::equal(first, e.table()));
}

TEST(PinnedEmbedding, SetOptimizerOptionsKeepsStateAndStep) {
  PinnedEmbedding e(40, 4, at::kFloat);
  e.normal_(0.0, 1.0, 1);
  c10::Dict<std::string, double> options;
  options.insert("lr", 0.1);
  e.set_optimizer("adam", options, true);
  e.apply_gradients(at::arange(10), at::ones({10, 4}));
  const at::Tensor state = e.state().clone();
  const at::Tensor rows = e.table().clone();
  c10::Dict<std::string, double> smaller;
  smaller.insert("lr", 0.0);
  e.set_optimizer_options(smaller);
  EXPECT_EQ(e.step_count(), 1);
  EXPECT_TRUE(at::equal(e.state(), state));
  e.apply_gradients(at::arange(10), at::ones({10, 4}));  // lr 0: the rows stay, the moments move on
  EXPECT_TRUE(at::equal(e.table(), rows));
  EXPECT_FALSE(at::equal(e.state(), state));
  EXPECT_EQ(e.step_count(), 2);
  c10::Dict<std::string, double> wider;
  wider.insert("amsgrad", 1.0);
  EXPECT_NE(error_of([&] { e.set_optimizer_options(wider); }).find("change the layout"), std::string::npos);
  EXPECT_EQ(e.optimizer_options().at("lr"), 0.0);
  PinnedEmbedding none(4, 4, at::kFloat);
  EXPECT_NE(error_of([&] { none.set_optimizer_options(smaller); }).find("no optimizer"), std::string::npos);
  const auto defaults = PinnedEmbedding::optimizer_defaults("adamw");
  EXPECT_EQ(defaults.at("weight_decay"), static_cast<double>(1e-2f));
  EXPECT_EQ(defaults.at("stochastic_rounding"), 0.0);
  EXPECT_EQ(defaults.size(), 8u);  // lr, per_row_step, stochastic_rounding, beta1, beta2, eps, weight_decay, amsgrad
}

TEST(PinnedEmbedding, GatherScatterDuplicatesLastWins) {
  PinnedEmbedding e(50, 3, at::kFloat);
  at::Tensor values = at::randn({50, 3});
  e.copy_(values);
  at::Tensor idx = at::tensor({7, 7, 49});
  EXPECT_TRUE(at::equal(e.gather(idx, std::nullopt), values.index_select(0, idx)));
  at::Tensor src = at::randn({3, 3});
  e.scatter_(idx, src);
  EXPECT_TRUE(at::equal(e.table()[7], src[1]));
}

// Operators the dispatcher runs on this thread while the callback below is installed (their RecordFunction names).
thread_local std::vector<std::string> dispatched_ops;

std::unique_ptr<at::ObserverContext> note_dispatched_op(const at::RecordFunction& fn) {
  dispatched_ops.emplace_back(fn.name());
  return nullptr;
}

// The table calls the core directly (csrc/transfer, csrc/optim) while it holds its lock: it does not go back
// through the dispatcher, which is the operator layer's (ops/) way in.
TEST(PinnedEmbedding, RowCallsDoNotReenterTheDispatcher) {
  PinnedEmbedding e(20, 4, at::kFloat);
  e.set_optimizer("sgd", c10::Dict<std::string, double>(), true);
  const at::Tensor idx = at::tensor({3, 9});
  const at::Tensor rows = at::randn({2, 4});
  dispatched_ops.clear();
  const at::CallbackHandle handle = at::addThreadLocalCallback(at::RecordFunctionCallback(note_dispatched_op));
  e.scatter_(idx, rows);
  const at::Tensor got = e.gather(idx, std::nullopt);
  e.apply_gradients(idx, at::ones({2, 4}));
  at::removeCallback(handle);
  EXPECT_TRUE(at::equal(got, rows));
  for (const std::string& name : dispatched_ops) EXPECT_EQ(name.rfind("speedtorch::", 0), std::string::npos) << name;
}

// Errors name the method that was called, not the operator behind it.
TEST(PinnedEmbedding, RowCallErrorsNameTheMethod) {
  PinnedEmbedding e(20, 4, at::kFloat);
  e.set_optimizer("sgd", c10::Dict<std::string, double>(), true);
  EXPECT_NE(error_of([&] { e.gather(at::tensor({1.0f}), std::nullopt); })
                .find("PinnedEmbedding.gather: indices must be int64 or int32"),
            std::string::npos);
  EXPECT_NE(error_of([&] { e.gather(at::tensor({20}), std::nullopt); })
                .find("PinnedEmbedding.gather: indices holds 20"),
            std::string::npos);
  EXPECT_NE(error_of([&] { e.scatter_(at::tensor({1}), at::randn({2, 4})); })
                .find("PinnedEmbedding.scatter_: src must have shape"),
            std::string::npos);
  EXPECT_NE(error_of([&] { e.apply_gradients(at::tensor({1}), at::randn({1, 3})); })
                .find("PinnedEmbedding.apply_gradients: grad must have shape"),
            std::string::npos);
}

TEST(PinnedEmbedding, RejectsBadConstruction) {
  EXPECT_THROW(PinnedEmbedding(-1, 4, at::kFloat), c10::Error);
  EXPECT_THROW(PinnedEmbedding(4, 0, at::kFloat), c10::Error);
  EXPECT_THROW(PinnedEmbedding(4, 4, at::kLong), c10::Error);
}

TEST(PinnedEmbedding, RegisteredAsCustomClass) {
  auto obj = torch::make_custom_class<PinnedEmbedding>(int64_t{20}, int64_t{4}, at::kFloat);
  auto e = obj.toCustomClass<PinnedEmbedding>();
  EXPECT_EQ(e->num_rows(), 20);
}

}  // namespace
}  // namespace speedtorch

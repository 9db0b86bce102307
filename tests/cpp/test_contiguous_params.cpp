// Tests for csrc/contiguous/contiguous_params used from C++: a torch::nn model and torch::optim optimizers on the
// flat buffers against the same optimizers on an untouched copy of the model, the buffer checks, and bad input.
#include <gtest/gtest.h>
#include <torch/custom_class.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "contiguous/contiguous_params.h"
#include "error_text.h"

namespace speedtorch {
namespace {

using testing::error_of;

// Random leaves that require grad (never zeros: zeros hide a missed copy).
std::vector<at::Tensor> random_params(const std::vector<std::vector<int64_t>>& shapes, at::ScalarType dtype) {
  std::vector<at::Tensor> out;
  for (const auto& shape : shapes) out.push_back(torch::randn(shape, torch::dtype(dtype)).requires_grad_(true));
  return out;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// A loss that gives every parameter a different, data-dependent gradient.
at::Tensor loss_of(const std::vector<at::Tensor>& params) {
  at::Tensor loss = torch::zeros({}, params[0].options().requires_grad(false));
  for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i].sin() * static_cast<double>(i + 1)).sum();
  return loss;
}

TEST(ContiguousParams, ParamsBecomeViewsAndKeepTheirValues) {
  auto params = random_params({{3, 4}, {5}, {2, 3, 2}}, at::kFloat);
  auto before = clones(params);
  ContiguousParams cp(params, {"a", "b", "c"});
  ASSERT_EQ(cp.num_groups(), 1);
  at::Tensor flat = cp.contiguous()[0];
  EXPECT_TRUE(flat.is_leaf());
  EXPECT_TRUE(flat.requires_grad());
  EXPECT_TRUE(flat.grad().is_same(cp.grad_buffers()[0]));
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(at::equal(params[i], before[i]));
    EXPECT_EQ(params[i].data_ptr(),
              static_cast<char*>(flat.data_ptr()) + cp.offset_of(static_cast<int64_t>(i)) * flat.element_size());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(params[i].data_ptr()) % 64, 0u);  // aligned views
  }
  cp.assert_buffer_is_valid();
}

TEST(ContiguousParams, BackwardAccumulatesIntoTheFlatGradBuffer) {
  auto params = random_params({{3, 4}, {5}, {7, 2}}, at::kFloat);
  auto reference = clones(params);
  ContiguousParams cp(params);
  for (int pass = 0; pass < 2; ++pass) {  // two passes: accumulation, not just the first write
    loss_of(params).backward();
    loss_of(reference).backward();
  }
  cp.assert_buffer_is_valid();
  at::Tensor grad = cp.grad_buffers()[0];
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor slice = grad.narrow(0, cp.offset_of(static_cast<int64_t>(i)), params[i].numel());
    EXPECT_TRUE(at::allclose(slice, reference[i].grad().reshape(-1)));
    EXPECT_TRUE(at::allclose(params[i].grad(), reference[i].grad()));
  }
}

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// Steps a torch::nn model through its flat buffers and a clone through its own parameters with the same data;
// expects the same parameters after every step.
void expect_same_training(const MakeOptimizer& make_optimizer) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  auto reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  ContiguousParams cp(model->parameters(), names);
  auto opt = make_optimizer(cp.contiguous());
  auto opt_ref = make_optimizer(reference->parameters());
  for (int step = 0; step < 5; ++step) {
    at::Tensor x = torch::randn({4, 6});
    cp.zero_grad();
    opt_ref->zero_grad();
    model->forward(x).pow(2).sum().backward();
    reference->forward(x).pow(2).sum().backward();
    cp.assert_buffer_is_valid();
    opt->step();
    opt_ref->step();
    auto got = model->parameters();
    auto want = reference->parameters();
    for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(at::allclose(got[i], want[i], 1e-6, 1e-7)) << names[i];
  }
}

TEST(ContiguousParams, TorchOptimAdamOnFlatMatchesAdamOnOriginals) {
  expect_same_training([](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2).weight_decay(1e-3));
  });
}

TEST(ContiguousParams, TorchOptimSgdMomentumOnFlatMatchesSgdOnOriginals) {
  expect_same_training([](std::vector<at::Tensor> params) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1e-2).momentum(0.9));
  });
}

TEST(ContiguousParams, OneGroupPerDtype) {
  auto params = random_params({{4}, {2, 2}}, at::kFloat);
  auto doubles = random_params({{3}}, at::kDouble);
  params.insert(params.begin() + 1, doubles[0]);
  ContiguousParams cp(params);
  ASSERT_EQ(cp.num_groups(), 2);
  EXPECT_EQ(cp.group_of(0), 0);
  EXPECT_EQ(cp.group_of(1), 1);
  EXPECT_EQ(cp.group_of(2), 0);
  EXPECT_EQ(cp.contiguous()[1].scalar_type(), at::kDouble);
  loss_of(params).backward();
  cp.assert_buffer_is_valid();
}

TEST(ContiguousParams, ZeroGradKeepsTheViewsAndRepointsNoneGrads) {
  auto params = random_params({{3, 4}, {5}}, at::kFloat);
  ContiguousParams cp(params, {"w", "b"});
  loss_of(params).backward();
  void* grad_ptr = params[1].grad().data_ptr();
  cp.zero_grad();
  EXPECT_EQ(params[1].grad().data_ptr(), grad_ptr);
  EXPECT_EQ(cp.grad_buffers()[0].count_nonzero().item<int64_t>(), 0);
  params[0].mutable_grad() = at::Tensor();  // what module.zero_grad() does
  cp.contiguous()[0].mutable_grad() = at::Tensor();  // what optimizer.zero_grad() does
  cp.zero_grad();
  cp.assert_buffer_is_valid();
}

TEST(ContiguousParams, ErrorsNameTheParameterThatLeftTheBuffer) {
  auto params = random_params({{3, 4}, {5}}, at::kFloat);
  ContiguousParams cp(params, {"w", "b"});
  const at::Tensor original = params[1].detach();

  params[1].set_data(torch::randn({5}));
  EXPECT_NE(error_of([&] { cp.assert_buffer_is_valid(); }).find("parameter 1 ('b') was replaced instead of updated"),
            std::string::npos);
  EXPECT_FALSE(cp.buffer_is_valid());
  params[1].set_data(torch::randn({5}, torch::kDouble));
  EXPECT_NE(error_of([&] { cp.assert_buffer_is_valid(); }).find("parameter 1 ('b') was moved or converted"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cp.zero_grad(); }).find("parameter 1 ('b') was moved or converted"), std::string::npos);
  params[1].set_data(original);
  cp.assert_buffer_is_valid();

  params[0].mutable_grad() = torch::zeros({3, 4});
  EXPECT_NE(error_of([&] { cp.assert_buffer_is_valid(); }).find("parameter 0 ('w').grad was replaced"),
            std::string::npos);
  params[0].mutable_grad() = at::Tensor();
  EXPECT_NE(error_of([&] { cp.assert_buffer_is_valid(); }).find("parameter 0 ('w').grad is None"), std::string::npos);
  cp.zero_grad();
  cp.contiguous()[0].mutable_grad() = at::Tensor();
  EXPECT_NE(
      error_of([&] { cp.assert_buffer_is_valid(); }).find("flat parameter of group 0 (cpu, Float) has .grad None"),
      std::string::npos);
}

TEST(ContiguousParams, RejectsBadInput) {
  auto good = random_params({{2}}, at::kFloat);
  EXPECT_NE(error_of([] { ContiguousParams({}); }).find("params must hold at least one tensor"), std::string::npos);
  EXPECT_NE(error_of([&] { ContiguousParams(good, {"a", "b"}); }).find("expected 1 names, got 2"), std::string::npos);
  EXPECT_NE(error_of([] { ContiguousParams({torch::randn({2})}); }).find("parameter 0 does not require grad"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ContiguousParams({good[0], good[0]}); }).find("parameter 1 appears more than once"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ContiguousParams({good[0] * 2}); }).find("parameter 0 must be a leaf tensor"),
            std::string::npos);
  EXPECT_NE(error_of([] { ContiguousParams({torch::ones({2}, torch::kLong)}); }).find("must be floating point"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ContiguousParams cp(good); cp.group_of(1); })
                .find("parameter index must be in [0, 1), got 1"),
            std::string::npos);
}

TEST(ContiguousParams, RegisteredAsCustomClass) {
  auto params = random_params({{3}, {2, 2}}, at::kFloat);
  auto obj = torch::make_custom_class<ContiguousParams>(params, std::vector<std::string>{});
  auto cp = obj.toCustomClass<ContiguousParams>();
  EXPECT_EQ(cp->num_params(), 2);
  EXPECT_EQ(cp->original()[1].unsafeGetTensorImpl(), params[1].unsafeGetTensorImpl());
}

}  // namespace
}  // namespace speedtorch

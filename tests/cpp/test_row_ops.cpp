// Tests for ops/ (gather, scatter_ through the dispatcher, as C++ callers use them), CPU and, when present, CUDA.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>

#include "memory/pinned_host_buffer.h"
#include "row_ops.h"
#include "error_text.h"

namespace speedtorch {
namespace {

using testing::error_of;

TEST(RowOps, GatherShapesAndValues) {
  at::Tensor table = at::randn({30, 5});
  at::Tensor idx = at::randint(0, 30, {4, 6}, at::kLong);
  at::Tensor out = ops::gather(table, idx);
  EXPECT_EQ(out.sizes(), at::IntArrayRef({4, 6, 5}));
  EXPECT_TRUE(at::equal(out, table.index({idx})));
  EXPECT_EQ(ops::gather(table, at::empty({0}, at::kInt)).sizes(), at::IntArrayRef({0, 5}));
}

TEST(RowOps, ScatterReturnsTheTableAndLastWins) {
  at::Tensor table = at::randn({10, 3});
  at::Tensor idx = at::tensor(std::vector<int64_t>{4, 4, 7});
  at::Tensor src = at::randn({3, 3});
  at::Tensor& result = ops::scatter_(table, idx, src);
  EXPECT_EQ(result.data_ptr(), table.data_ptr());
  EXPECT_TRUE(at::equal(table[4], src[1]));
  EXPECT_TRUE(at::equal(table[7], src[2]));
}

TEST(RowOps, ErrorsNameTheArgument) {
  at::Tensor table = at::randn({10, 3});
  EXPECT_NE(error_of([&] { ops::gather(table, at::tensor({10})); }).find("indices holds 10"), std::string::npos);
  EXPECT_NE(error_of([&] { ops::gather(table, at::tensor({1.0})); }).find("indices must be int64 or int32"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::gather(at::randn({10}), at::tensor({1})); }).find("table must be 2-D"),
            std::string::npos);
  at::Tensor idx = at::tensor({1, 2});
  EXPECT_NE(error_of([&] { ops::scatter_(table, idx, at::randn({3, 3})); }).find("src must have shape"),
            std::string::npos);
}

TEST(RowOps, ScatterRefusesSrcThatSharesTheTablesMemory) {
  at::Tensor table = at::arange(30, at::kFloat).reshape({10, 3});
  const at::Tensor before = table.clone();
  at::Tensor idx = at::arange(1, 6, at::kLong);
  const std::string text = error_of([&] { ops::scatter_(table, idx, table.narrow(0, 0, 5)); });
  EXPECT_NE(text.find("speedtorch.scatter_: src and the table share memory"), std::string::npos) << text;
  EXPECT_TRUE(at::equal(table, before));
  ops::scatter_(table, idx, table.narrow(0, 0, 5).clone());
  EXPECT_TRUE(at::equal(table.narrow(0, 1, 5), before.narrow(0, 0, 5)));
}

bool cuda_ready() { return cuda_device_available() && at::hasCUDA(); }

TEST(RowOpsCuda, PinnedTableRoundTrip) {
  if (!cuda_ready()) GTEST_SKIP() << "no CUDA device";
  at::Tensor table = pinned_empty({4000, 64}, at::kFloat);
  table.copy_(at::randn({4000, 64}));
  at::Tensor idx = at::randint(0, 4000, {3000}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  at::Tensor rows = ops::gather(table, idx);
  ASSERT_TRUE(rows.is_cuda());
  EXPECT_TRUE(at::equal(rows.cpu(), table.index_select(0, idx.cpu())));
  at::Tensor unique = std::get<0>(at::_unique(idx));
  at::Tensor src = at::randn({unique.numel(), 64}, rows.options());
  ops::scatter_(table, unique, src);
  torch::cuda::synchronize();
  EXPECT_TRUE(at::equal(table.index_select(0, unique.cpu()), src.cpu()));
}

TEST(RowOpsCuda, BadCudaIndexRaisesIndexError) {
  if (!cuda_ready()) GTEST_SKIP() << "no CUDA device";
  at::Tensor table = pinned_empty({100, 8}, at::kFloat);
  at::Tensor idx = at::tensor({1, 500}).to(at::kCUDA);
  EXPECT_THROW(ops::gather(table, idx), c10::IndexError);
}

}  // namespace
}  // namespace speedtorch

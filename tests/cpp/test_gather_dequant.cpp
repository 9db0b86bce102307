// Tests for ops/gather_dequant_op.h (speedtorch::gather_dequant through the dispatcher) and the row layouts of
// csrc/core/row_formats.h, on rows written by hand.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_text.h"
#include "gather_dequant_op.h"

namespace speedtorch {
namespace {

using testing::error_of;

std::vector<float> as_floats(const at::Tensor& t) {
  const at::Tensor f = t.to(at::kFloat).contiguous().reshape({-1});
  return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
}

TEST(GatherDequant, Int8RowsAreScaleBiasThenCodes) {
  // Row 1: float16 scale 0.5 (0x3800), bias -1 (0xBC00), codes 0, 2, 255, 10 -> -1, 0, 126.5, 4.
  at::Tensor table = at::zeros({2, 16}, at::kByte);
  const std::vector<uint8_t> row = {0x00, 0x38, 0x00, 0xBC, 0, 2, 255, 10};
  for (size_t i = 0; i < row.size(); ++i) table[1][static_cast<int64_t>(i)] = row[i];
  const at::Tensor out = ops::gather_dequant(table, at::tensor(std::vector<int64_t>{1, 1}), "int8_rowwise", 4);
  EXPECT_EQ(out.scalar_type(), at::kBFloat16);
  EXPECT_EQ(as_floats(out), (std::vector<float>{-1, 0, 126.5, 4, -1, 0, 126.5, 4}));
}

TEST(GatherDequant, Fp8RowsAreCodesThenBlockScales) {
  // dim 64: codes 0x38 (1.0) and 0xC0 (-2.0); block 0 scaled by 2^(128-127), block 1 by 2^(125-127).
  at::Tensor table = at::zeros({1, 66}, at::kByte);
  table.narrow(1, 0, 32).fill_(0x38);
  table.narrow(1, 32, 32).fill_(0xC0);
  table[0][64] = 128;
  table[0][65] = 125;
  const at::Tensor ids = at::tensor(std::vector<int32_t>{0});
  const std::vector<float> values = as_floats(ops::gather_dequant(table, ids, "fp8_e4m3_ue8m0", 64));
  EXPECT_EQ(values.front(), 2.0f);
  EXPECT_EQ(values.back(), -0.5f);
}

TEST(GatherDequant, BadInputIsNamed) {
  const at::Tensor table = at::zeros({3, 16}, at::kByte);
  EXPECT_NE(error_of([&] { ops::gather_dequant(table, at::tensor(std::vector<int64_t>{0}), "int4", 8); })
                .find("unknown row format 'int4'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::gather_dequant(table, at::tensor(std::vector<int64_t>{3}), "int8_rowwise", 8); })
                .find("indices holds 3"),
            std::string::npos);
}

}  // namespace
}  // namespace speedtorch

// Tests for csrc/cpu/index_range_check: finds the first bad index, both index types, the error text, and the
// tensor entry point.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu/index_range_check.h"

namespace speedtorch {
namespace {

TEST(IndexRangeCheck, AcceptsValidIndices) {
  std::vector<int64_t> idx(200000);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i % 97);
  EXPECT_FALSE(find_index_out_of_range(idx.data(), idx.size(), 97).found);
  EXPECT_FALSE(find_index_out_of_range<int64_t>(nullptr, 0, 0).found);
}

TEST(IndexRangeCheck, ReportsTheFirstBadPosition) {
  std::vector<int32_t> idx(300000, 5);
  idx[250000] = -3;
  idx[123457] = 10;
  const IndexRangeViolation bad = find_index_out_of_range(idx.data(), idx.size(), 10);
  ASSERT_TRUE(bad.found);
  EXPECT_EQ(bad.position, 123457);
  EXPECT_EQ(bad.value, 10);
}

TEST(IndexRangeCheck, MessageNamesOpArgumentValueAndRange) {
  const std::vector<int64_t> idx = {0, -1};
  try {
    check_indices_in_range(idx.data(), 2, 4, "speedtorch.gather", "indices");
    FAIL() << "expected an IndexError";
  } catch (const c10::IndexError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("speedtorch.gather: indices holds -1 at flat position 1"), std::string::npos) << what;
    EXPECT_NE(what.find("[0, 4)"), std::string::npos) << what;
  }
}

TEST(IndexRangeCheck, EmptyTableRejectsEverything) {
  const std::vector<int64_t> idx = {0};
  EXPECT_TRUE(find_index_out_of_range(idx.data(), 1, 0).found);
}

// The tensor entry every route calls (CPU routes directly, GPU routes through validate_indices).
TEST(IndexRangeCheck, TensorCheckTakesBothIndexTypesAndNamesTheOp) {
  for (const auto dtype : {at::kLong, at::kInt}) {
    const at::Tensor good = at::arange(7, at::TensorOptions().dtype(dtype));
    const IndexSpan span = check_index_tensor(good, 7, "speedtorch.scatter_");
    EXPECT_EQ(span.min, 0);
    EXPECT_EQ(span.max, 6);
    const at::Tensor bad = at::tensor({3, 9, 1}, at::TensorOptions().dtype(dtype));
    try {
      check_index_tensor(bad, 7, "speedtorch.scatter_");
      FAIL() << "expected an IndexError";
    } catch (const c10::IndexError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("speedtorch.scatter_: indices holds 9 at flat position 1"), std::string::npos) << what;
    }
  }
}

// sorted_unique=True callers: strictly increasing indices pass with their span; a repeat, a step down or a bad
// index is refused, naming the position.
TEST(IndexRangeCheck, SortedUniqueCheckAcceptsIncreasingIndicesOnly) {
  for (const auto dtype : {at::kLong, at::kInt}) {
    const auto options = at::TensorOptions().dtype(dtype);
    const IndexSpan span = check_sorted_unique_index_tensor(at::tensor({2, 5, 6, 40}, options), 41, "op");
    EXPECT_EQ(span.min, 2);
    EXPECT_EQ(span.max, 40);
    EXPECT_GT(check_sorted_unique_index_tensor(at::empty({0}, options), 0, "op").min,
              check_sorted_unique_index_tensor(at::empty({0}, options), 0, "op").max);
    for (const auto& [values, position] : {std::pair<std::vector<int64_t>, int>{{1, 3, 3, 5}, 2},
                                           std::pair<std::vector<int64_t>, int>{{4, 1}, 1}}) {
      try {
        check_sorted_unique_index_tensor(at::tensor(values, options), 10, "speedtorch.row_optimizer_step_");
        FAIL() << "expected a ValueError";
      } catch (const c10::ValueError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("sorted_unique=True"), std::string::npos) << what;
        EXPECT_NE(what.find("position " + std::to_string(position) + " holds"), std::string::npos) << what;
      }
    }
    EXPECT_THROW(check_sorted_unique_index_tensor(at::tensor({-1, 2}, options), 10, "op"), c10::IndexError);
    EXPECT_THROW(check_sorted_unique_index_tensor(at::tensor({2, 10}, options), 10, "op"), c10::IndexError);
  }
}

}  // namespace
}  // namespace speedtorch

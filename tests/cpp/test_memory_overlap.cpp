// Tests for core/memory_overlap.h: which tensors may share memory, compared by address.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "core/memory_overlap.h"
#include "error_text.h"

namespace speedtorch {
namespace {

using testing::error_of;

TEST(MemoryOverlap, RowsOfOneTable) {
  at::Tensor table = at::randn({10, 3});
  EXPECT_TRUE(may_share_memory(table, table.narrow(0, 0, 5)));
  EXPECT_TRUE(may_share_memory(table.narrow(0, 1, 5), table.narrow(0, 0, 5)));
  EXPECT_FALSE(may_share_memory(table.narrow(0, 0, 5), table.narrow(0, 5, 5)));  // adjacent, no byte in common
  EXPECT_FALSE(may_share_memory(table, at::randn({10, 3})));
  EXPECT_FALSE(may_share_memory(table, table.narrow(0, 2, 0)));  // no elements: nothing is read
}

TEST(MemoryOverlap, AddressesNotStorages) {
  // Two storages over one buffer (as PinnedEmbedding's tensor_over makes them).
  at::Tensor table = at::randn({10, 3});
  at::Tensor alias = at::from_blob(table.data_ptr<float>() + 6, {2, 3}, table.options());
  EXPECT_FALSE(alias.is_alias_of(table));
  EXPECT_TRUE(may_share_memory(table, alias));
}

TEST(MemoryOverlap, StridedTensorsSpanTheirGaps) {
  at::Tensor wide = at::randn({10, 8});
  at::Tensor left = wide.narrow(1, 0, 4);
  EXPECT_TRUE(may_share_memory(left, wide.narrow(1, 4, 4)));  // in the gaps: refused though no element is shared
  EXPECT_FALSE(may_share_memory(left.narrow(0, 0, 2), wide.narrow(0, 5, 2)));
  // A transposed view spans the same bytes as the table.
  EXPECT_TRUE(may_share_memory(wide.t(), wide.narrow(0, 9, 1)));
}

TEST(MemoryOverlap, TheErrorNamesBothAndTheWayOut) {
  at::Tensor table = at::randn({10, 3});
  const std::string text =
      error_of([&] { check_no_overlap(table, "the table", table.narrow(0, 0, 5), "src", "speedtorch.scatter_"); });
  EXPECT_NE(text.find("speedtorch.scatter_: src and the table share memory"), std::string::npos) << text;
  EXPECT_NE(text.find("pass a copy: src.clone()"), std::string::npos) << text;
  EXPECT_NO_THROW(check_no_overlap(table, "the table", table.clone(), "src", "speedtorch.scatter_"));
}

}  // namespace
}  // namespace speedtorch

// Tests for csrc/memory/huge_page_output: the large CPU outputs' memory holds what is written to it, whatever its
// size, and behaves as any CPU tensor's (resizing, freeing).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "memory/huge_page_output.h"

namespace speedtorch {
namespace {

TEST(HugePageOutput, SmallAndLargeBlocksHoldTheirValues) {
  // Below and above the size mapped in huge pages (32 MiB), and one not a whole number of pages.
  for (const int64_t rows : {int64_t{3}, int64_t{70000}, int64_t{(int64_t{33} << 20) / 512 + 1}}) {
    at::Tensor out = empty_cpu_output({rows, 128}, at::kFloat);
    ASSERT_TRUE(out.is_cpu());
    ASSERT_TRUE(out.is_contiguous());
    ASSERT_EQ(out.sizes(), at::IntArrayRef({rows, 128}));
    ASSERT_EQ(out.scalar_type(), at::kFloat);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(out.data_ptr()) % 64, 0u);
    const at::Tensor values = at::arange(rows * 128, at::kFloat).view({rows, 128});
    out.copy_(values);  // writes every byte, the last page included
    EXPECT_TRUE(at::equal(out, values));
  }
}

TEST(HugePageOutput, OtherDtypesAndEmptyShapes) {
  at::Tensor half = empty_cpu_output({5, 7, 3}, at::kBFloat16);
  EXPECT_EQ(half.sizes(), at::IntArrayRef({5, 7, 3}));
  EXPECT_EQ(half.scalar_type(), at::kBFloat16);
  at::Tensor none = empty_cpu_output({0, 128}, at::kFloat);
  EXPECT_EQ(none.numel(), 0);
}

TEST(HugePageOutput, ALargeBlockResizesAndKeepsItsValues) {
  const int64_t rows = (int64_t{32} << 20) / 512;  // exactly the mapped size
  at::Tensor out = empty_cpu_output({rows, 128}, at::kFloat);
  out.fill_(2.5f);
  out.resize_({rows + 1000, 128});  // a new block from the same allocator, the old contents copied
  EXPECT_TRUE(at::equal(out.narrow(0, 0, rows), at::full({rows, 128}, 2.5f)));
  out.narrow(0, rows, 1000).fill_(-1.0f);
  EXPECT_EQ(out[rows + 999][127].item<float>(), -1.0f);
  out.resize_({10, 128});  // shrinking keeps the block
  EXPECT_EQ(out[9][0].item<float>(), 2.5f);
}

}  // namespace
}  // namespace speedtorch

// Tests for csrc/embedding/pinned_embedding used from C++ directly and through torch::make_custom_class.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>

#include "embedding/pinned_embedding.h"

namespace speedtorch {
namespace {

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

TEST(PinnedEmbedding, GatherScatterThroughTheDispatcher) {
  PinnedEmbedding e(50, 3, at::kFloat);
  at::Tensor values = at::randn({50, 3});
  e.copy_(values);
  at::Tensor idx = at::tensor({7, 7, 49});
  EXPECT_TRUE(at::equal(e.gather(idx, std::nullopt), values.index_select(0, idx)));
  at::Tensor src = at::randn({3, 3});
  e.scatter_(idx, src);
  EXPECT_TRUE(at::equal(e.table()[7], src[1]));
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

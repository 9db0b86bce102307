// Tests for csrc/optim/row_optimizer: the layout facts a step plans with (its math is tested against torch.optim in
// tests/python/test_row_optimizer.py).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/custom_class.h>

#include "embedding/pinned_embedding.h"
#include "optim/row_optimizer.h"

namespace speedtorch {
namespace {

c10::Dict<std::string, double> adam() {
  c10::Dict<std::string, double> options;
  options.insert("lr", 0.01);
  return options;
}

TEST(RowOptimizer, RecordStrideOfStateBesideTheRows) {
  // One allocation, each row's weights then its state: a batch walks one record per row. The two tensors are views
  // of their own (from_blob), so they never share a storage pointer: the layout must be read from the addresses.
  auto emb = c10::make_intrusive<PinnedEmbedding>(50, 6, at::kFloat);
  emb->set_optimizer("adam", adam(), /*state_beside_rows=*/true);
  const at::Tensor weights = emb->table();
  const at::Tensor state = emb->state();
  ASSERT_NE(weights.stride(0), weights.size(1));  // the records are wider than the weights
  EXPECT_EQ(optimizer_record_stride_bytes(weights, state), weights.stride(0) * 4);
}

TEST(RowOptimizer, RecordStrideOfStateInATableOfItsOwn) {
  auto emb = c10::make_intrusive<PinnedEmbedding>(50, 6, at::kHalf);
  emb->set_optimizer("adam", adam(), /*state_beside_rows=*/false);
  EXPECT_EQ(optimizer_record_stride_bytes(emb->table(), emb->state()), 6 * 2 + emb->state().stride(0) * 4);
  // Any two tensors: their strides add up, even when the state's rows start inside the weights' rows.
  const at::Tensor block = at::zeros({10, 16});
  EXPECT_EQ(optimizer_record_stride_bytes(block.narrow(1, 0, 8), block.narrow(1, 4, 12)), 2 * 16 * 4);
  EXPECT_EQ(optimizer_record_stride_bytes(at::zeros({10, 4}), at::zeros({10, 12})), (4 + 12) * 4);
}

}  // namespace
}  // namespace speedtorch

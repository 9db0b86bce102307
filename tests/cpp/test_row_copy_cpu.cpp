// Tests for csrc/cpu/row_copy_cpu: gather and scatter against sequential references, duplicates, keep masks.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cpu/row_copy_cpu.h"

namespace speedtorch {
namespace {

HostRows rows_of(at::Tensor& t) {
  return HostRows{static_cast<char*>(t.data_ptr()), t.size(0), t.stride(0) * t.element_size(),
                  t.size(1) * t.element_size()};
}

std::vector<int64_t> random_indices(int64_t count, int64_t num_rows, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> pick(0, num_rows - 1);
  std::vector<int64_t> idx(count);
  for (auto& v : idx) v = pick(gen);
  return idx;
}

TEST(RowCopyCpu, GatherMatchesIndexSelect) {
  at::Tensor table = at::randn({5000, 37});
  const auto idx = random_indices(12345, 5000, 1);
  at::Tensor out = at::empty({12345, 37});
  gather_rows_cpu(rows_of(table), idx.data(), 12345, static_cast<char*>(out.data_ptr()));
  EXPECT_TRUE(at::equal(out, table.index_select(0, at::tensor(idx))));
}

TEST(RowCopyCpu, GatherHonoursRowStride) {
  at::Tensor wide = at::randn({100, 16});
  at::Tensor table = wide.narrow(1, 4, 8);
  std::vector<int32_t> idx = {99, 0, 50, 50};
  at::Tensor out = at::empty({4, 8});
  gather_rows_cpu(rows_of(table), idx.data(), 4, static_cast<char*>(out.data_ptr()));
  EXPECT_TRUE(at::equal(out, table.index_select(0, at::tensor(std::vector<int64_t>{99, 0, 50, 50}))));
}

class ScatterThreads : public ::testing::TestWithParam<int> {};

TEST_P(ScatterThreads, DuplicatesLastOccurrenceWins) {
  const int previous = at::get_num_threads();
  at::set_num_threads(GetParam());
  at::Tensor table = at::randn({50, 8});
  at::Tensor expected = table.clone();
  // 40,000 rows of 32 bytes: over the bytes a batch needs before threads share it.
  const auto idx = random_indices(40000, 50, 2);
  at::Tensor src = at::randn({40000, 8});
  for (size_t i = 0; i < idx.size(); ++i) expected[idx[i]].copy_(src[i]);
  scatter_rows_cpu(rows_of(table), idx.data(), 40000, static_cast<const char*>(src.data_ptr()));
  at::set_num_threads(previous);
  EXPECT_TRUE(at::equal(table, expected));
}

INSTANTIATE_TEST_SUITE_P(Threads, ScatterThreads, ::testing::Values(1, 2, 3));

TEST(RowCopyCpu, ScatterWithKeepMaskWritesOnlyKeptPositions) {
  at::Tensor table = at::randn({10, 4});
  at::Tensor expected = table.clone();
  std::vector<int64_t> idx = {1, 2, 3, 4};
  std::vector<uint8_t> keep = {1, 0, 1, 0};
  at::Tensor src = at::randn({4, 4});
  expected[1].copy_(src[0]);
  expected[3].copy_(src[2]);
  scatter_rows_cpu(rows_of(table), idx.data(), 4, static_cast<const char*>(src.data_ptr()), keep.data());
  EXPECT_TRUE(at::equal(table, expected));
}

}  // namespace
}  // namespace speedtorch

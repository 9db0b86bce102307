// Tests for csrc/cpu/distinct_indices_cpu: distinct values and inverse against torch.unique(sorted=True,
// return_inverse=True), for any values, by the bitmap (dense ids) and by the hash table (ids spread wide).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cpu/distinct_indices_cpu.h"

namespace speedtorch {
namespace {

template <typename Index>
std::vector<Index> random_indices(int64_t count, int64_t num_rows, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> pick(0, num_rows - 1);
  std::vector<Index> idx(count);
  for (auto& v : idx) v = static_cast<Index>(pick(gen));
  return idx;
}

template <typename Index>
void expect_distinct_like_unique(const std::vector<Index>& idx) {
  const int64_t count = static_cast<int64_t>(idx.size());
  std::vector<int64_t> distinct(count, -7);
  std::vector<int64_t> inverse(count, -7);
  const int64_t n = distinct_indices_cpu(idx.data(), count, distinct.data(), inverse.data());
  const at::Tensor t = at::tensor(std::vector<int64_t>(idx.begin(), idx.end()), at::kLong);
  const auto [unique, expected_inverse, counts] = at::_unique2(t, /*sorted=*/true, /*return_inverse=*/true);
  ASSERT_EQ(n, unique.numel());
  EXPECT_TRUE(at::equal(at::tensor(std::vector<int64_t>(distinct.begin(), distinct.begin() + n)), unique));
  EXPECT_TRUE(at::equal(at::tensor(inverse), expected_inverse));
}

TEST(DistinctIndicesCpu, MatchUnique) {
  expect_distinct_like_unique(random_indices<int64_t>(10000, 700, 1));           // many duplicates
  expect_distinct_like_unique(random_indices<int32_t>(3000, 1 << 30, 2));        // nearly all distinct
  expect_distinct_like_unique(std::vector<int64_t>{int64_t{1} << 40, 0, 5, 0});  // wide values
  expect_distinct_like_unique(std::vector<int32_t>{9, 9, 9});
  expect_distinct_like_unique(std::vector<int64_t>{-1, 4, -1, INT64_MIN, 0, INT64_MAX, -7});  // any values
  expect_distinct_like_unique(std::vector<int32_t>{-3, INT32_MIN, -3, 2});
  expect_distinct_like_unique(std::vector<int64_t>{3});
  std::vector<int64_t> sorted(5000);
  for (int64_t i = 0; i < 5000; ++i) sorted[i] = 3 * i;  // what torch.unique hands over: already ascending
  expect_distinct_like_unique(sorted);
}

// Both ways the values are found: a bitmap over the span when the ids are dense in it (a table's rows), a hash table
// when they are spread wide.
TEST(DistinctIndicesCpu, DenseIdsOfAnySign) {
  std::vector<int64_t> around_zero = random_indices<int64_t>(1000, 201, 5);
  for (auto& v : around_zero) v -= 100;  // [-100, 100]: negative ids in the bitmap
  expect_distinct_like_unique(around_zero);
  expect_distinct_like_unique(std::vector<int32_t>{63, 64, 0, 127, 128, 64, 63, 191, 1});  // word edges
  expect_distinct_like_unique(std::vector<int64_t>{INT64_MAX, INT64_MAX - 1, INT64_MAX - 64, INT64_MAX});
  expect_distinct_like_unique(std::vector<int64_t>{INT64_MIN + 3, INT64_MIN, INT64_MIN + 200, INT64_MIN});
  std::vector<int64_t> one_span(300);  // 300 ids, a span of exactly 2 words per id: still the bitmap
  for (int64_t i = 0; i < 300; ++i) one_span[i] = (i * 7919) % (300 * 128);
  expect_distinct_like_unique(one_span);
}

TEST(DistinctIndicesCpu, NoIndicesNoDistinct) {
  EXPECT_EQ(distinct_indices_cpu(static_cast<const int64_t*>(nullptr), 0, nullptr, nullptr), 0);
}

}  // namespace
}  // namespace speedtorch

// Tests for csrc/cpu/row_sum_cpu: summed rows against index_add_ into zeros (bit for bit), on one thread and on
// several.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cpu/row_sum_cpu.h"

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

// Runs fn with `threads` intra-op threads, then restores the count.
template <typename Fn>
void with_threads(int threads, Fn&& fn) {
  const int previous = at::get_num_threads();
  at::set_num_threads(threads);
  fn();
  at::set_num_threads(previous);
}

class SumThreads : public ::testing::TestWithParam<int> {};

// Every row's sum in position order from zero: the bits of index_add_ into zeros, also where lanes split the rows.
TEST_P(SumThreads, SumMatchesIndexAddIntoZeros) {
  for (const int64_t count : {int64_t{37}, int64_t{40000}}) {  // 40,000 x 33 floats: more than one lane's grain
    const int64_t out_rows = 300;
    const int64_t dim = 33;
    const auto idx = random_indices<int32_t>(count, out_rows - 10, static_cast<unsigned>(count));  // rows never named
    const at::Tensor src = at::randn({count, dim});
    at::Tensor out = at::full({out_rows, dim}, 123.0f);  // poisoned: every row must be written
    with_threads(GetParam(), [&] {
      sum_rows_by_index_cpu(idx.data(), count, src.const_data_ptr<float>(), dim, out.data_ptr<float>(), out_rows);
    });
    const at::Tensor index = at::tensor(std::vector<int64_t>(idx.begin(), idx.end()));
    const at::Tensor expected = at::zeros({out_rows, dim}).index_add_(0, index, src);
    EXPECT_TRUE(at::equal(out, expected)) << count << " positions";
  }
}

TEST_P(SumThreads, NegativeZeroGradientsSumAsIndexAddDoes) {
  const std::vector<int64_t> idx = {0, 1, 1};
  const at::Tensor src = at::full({3, 4}, -0.0f);
  at::Tensor out = at::full({2, 4}, 5.0f);
  with_threads(GetParam(), [&] {
    sum_rows_by_index_cpu(idx.data(), 3, src.const_data_ptr<float>(), 4, out.data_ptr<float>(), 2);
  });
  const at::Tensor expected = at::zeros({2, 4}).index_add_(0, at::tensor(idx), src);
  EXPECT_TRUE(at::equal(out.signbit(), expected.signbit()));
  EXPECT_TRUE(at::equal(out, expected));
}

INSTANTIATE_TEST_SUITE_P(Threads, SumThreads, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace speedtorch

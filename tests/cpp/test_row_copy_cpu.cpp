// Tests for csrc/cpu/row_copy_cpu: gather and scatter against sequential references, duplicates, keep masks, every
// row size the copies specialise and every way threads share a call; the checked gather's bad positions.
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
  // 40,000 rows of 32 bytes (1.28 MB): threads share it, as helpers (cpu/helped_parallel_for.h).
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

// Sets torch's intra-op thread count for a test, and puts it back.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : previous_(at::get_num_threads()) { at::set_num_threads(threads); }
  ~ThreadCount() { at::set_num_threads(previous_); }

 private:
  int previous_;
};

// The same bits: a copy, compared as integers (a float compare would pass -0.0 for 0.0 and fail NaN for NaN).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(a.contiguous().view(at::kByte), b.contiguous().view(at::kByte));
}

// Row sizes the copy specialises (64 to 512 bytes) and others, on the calling thread alone (< 1 MiB) and with
// helpers (1 to 4 MiB: 8,000 rows of 148 to 512 bytes), with 1 and 2 threads.
class GatherThreads : public ::testing::TestWithParam<int> {};

TEST_P(GatherThreads, BitsOfIndexSelectCheckedOrNot) {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t dim : {16, 32, 64, 128, 37}) {
      // Rows in a wider tensor: the table's stride is not its row size.
      at::Tensor wide = at::randn({3001, dim + 3}).to(dtype);
      at::Tensor table = wide.narrow(1, 1, dim);
      for (const int64_t count : {3, 100, 8000}) {
        const auto idx = random_indices(count, 3001, static_cast<unsigned>(count + dim));
        const std::vector<int32_t> idx32(idx.begin(), idx.end());
        const at::Tensor expected = table.index_select(0, at::tensor(idx));
        at::Tensor out = at::full({count, dim}, 7.0, at::TensorOptions().dtype(dtype));
        at::Tensor checked = at::full({count, dim}, 7.0, at::TensorOptions().dtype(dtype));
        int64_t bad = 0;
        {  // only the calls under test on several threads (torch's own kernels would run on OpenMP's, which make
           // tsan cannot follow)
          ThreadCount thread_count(GetParam());
          gather_rows_cpu(rows_of(table), idx.data(), count, static_cast<char*>(out.data_ptr()));
          bad = gather_rows_checked_cpu(rows_of(table), idx32.data(), count, static_cast<char*>(checked.data_ptr()));
        }
        EXPECT_TRUE(same_bits(out, expected)) << dtype << " dim " << dim << " count " << count;
        EXPECT_EQ(bad, -1);
        EXPECT_TRUE(same_bits(checked, expected)) << dtype << " dim " << dim << " count " << count << " checked";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, GatherThreads, ::testing::Values(1, 2));

// The checked gather names the smallest bad position whatever the threads and the range that meets it first.
class CheckedGatherThreads : public ::testing::TestWithParam<int> {};

TEST_P(CheckedGatherThreads, ReturnsTheFirstBadPosition) {
  at::Tensor table = at::randn({500, 32});
  at::Tensor out = at::empty({20000, 32});
  ThreadCount thread_count(GetParam());  // after torch's own kernels (make tsan cannot follow OpenMP's threads)
  for (const int64_t count : {int64_t{40}, int64_t{20000}}) {  // the calling thread alone; helpers
    char* o = static_cast<char*>(out.data_ptr());
    auto idx = random_indices(count, 500, 4);
    EXPECT_EQ(gather_rows_checked_cpu(rows_of(table), idx.data(), count, o), -1);
    idx[count - 1] = 500;  // one past the end, in the last range
    EXPECT_EQ(gather_rows_checked_cpu(rows_of(table), idx.data(), count, o), count - 1);
    idx[count / 2] = -1;  // negative, in a middle range
    EXPECT_EQ(gather_rows_checked_cpu(rows_of(table), idx.data(), count, o), count / 2);
    idx[3] = INT64_MAX;
    EXPECT_EQ(gather_rows_checked_cpu(rows_of(table), idx.data(), count, o), 3);
    std::vector<int32_t> idx32(idx.begin(), idx.end());
    idx32[3] = 7;
    EXPECT_EQ(gather_rows_checked_cpu(rows_of(table), idx32.data(), count, o), count / 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, CheckedGatherThreads, ::testing::Values(1, 2));

// Rows of width 0: nothing to copy, and a table or output of no memory (a null pointer) is never touched, but the
// checked gather still checks every index.
TEST(RowCopyCpu, RowsOfWidthZeroCopyNothingAndStillCheck) {
  const HostRows empty_rows{nullptr, 6, 0, 0};
  std::vector<int64_t> idx = {0, 5, 5, 2};
  gather_rows_cpu(empty_rows, idx.data(), 4, nullptr);
  EXPECT_EQ(gather_rows_checked_cpu(empty_rows, idx.data(), 4, nullptr), -1);
  scatter_rows_cpu(empty_rows, idx.data(), 4, nullptr);
  idx[2] = 6;
  EXPECT_EQ(gather_rows_checked_cpu(empty_rows, idx.data(), 4, nullptr), 2);
}

// Calls above 4 MiB, which went to OpenMP's threads before issue 30 and go to the helpers now, as every copy above
// 1 MiB (row_copy_cpu.cpp says why). Left out of make tsan: torch's own kernels here run on OpenMP's threads, and
// libgomp is not instrumented.
TEST(RowCopyLarge, GatherAndScatterAbove4MiBWithTwoThreads) {
  ThreadCount thread_count(2);
  at::Tensor table = at::randn({3000, 128});
  const auto idx = random_indices(10000, 3000, 5);  // 5 MB of rows, duplicates
  at::Tensor out = at::empty({10000, 128});
  EXPECT_EQ(gather_rows_checked_cpu(rows_of(table), idx.data(), 10000, static_cast<char*>(out.data_ptr())), -1);
  EXPECT_TRUE(same_bits(out, table.index_select(0, at::tensor(idx))));
  at::Tensor src = at::randn({10000, 128});
  at::Tensor expected = table.clone();
  for (size_t i = 0; i < idx.size(); ++i) expected[idx[i]].copy_(src[i]);
  scatter_rows_cpu(rows_of(table), idx.data(), 10000, static_cast<const char*>(src.data_ptr()));
  EXPECT_TRUE(same_bits(table, expected));
}

}  // namespace
}  // namespace speedtorch

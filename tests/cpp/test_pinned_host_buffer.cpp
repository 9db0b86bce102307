// Tests for csrc/memory/pinned_host_buffer: exact size, zero fill, pinning, lifetime.
#include <ATen/ops/from_blob.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "error_text.h"
#include "memory/pinned_host_buffer.h"
#include "temp_dir.h"

namespace speedtorch {
namespace {

TEST(PinnedHostBuffer, MapsWholePagesOnly) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  PinnedHostBuffer buffer(10 * page + 1);
  EXPECT_EQ(buffer.size(), 10 * page + 1);
  EXPECT_EQ(buffer.mapped_size(), 11 * page);
  EXPECT_EQ(buffer.is_pinned(), cuda_device_available());
}

TEST(PinnedHostBuffer, StartsZeroedAndIsWritable) {
  PinnedHostBuffer buffer(1 << 20);
  const auto* bytes = static_cast<const unsigned char*>(buffer.data());
  for (std::size_t i = 0; i < buffer.size(); i += 4093) ASSERT_EQ(bytes[i], 0);
  std::memset(buffer.data(), 0xAB, buffer.size());
  EXPECT_EQ(bytes[buffer.size() - 1], 0xAB);
}

TEST(PinnedHostBuffer, RejectsEmpty) { EXPECT_THROW(PinnedHostBuffer(0), c10::Error); }

TEST(PinnedEmpty, ShapeDtypeAndExactStorage) {
  at::Tensor t = pinned_empty({1000, 33}, at::kHalf);
  EXPECT_EQ(t.sizes(), at::IntArrayRef({1000, 33}));
  EXPECT_EQ(t.scalar_type(), at::kHalf);
  EXPECT_EQ(t.storage().nbytes(), 1000u * 33u * 2u);
  EXPECT_EQ(t.count_nonzero().item<int64_t>(), 0);
  EXPECT_EQ(is_pinned_host_memory(t.data_ptr()), cuda_device_available());
  EXPECT_EQ(t.is_pinned(), cuda_device_available());  // PyTorch agrees once the table exists
}

TEST(PinnedEmpty, PageableMemoryIsNotPinned) {
  std::vector<float> plain(1024);
  EXPECT_FALSE(is_pinned_host_memory(plain.data()));
}

TEST(PinnedEmpty, StorageOutlivesTheFirstTensor) {
  at::Tensor view;
  {
    at::Tensor t = pinned_empty({256, 4}, at::kFloat);
    view = t.narrow(0, 10, 5);
  }
  view.fill_(2.0);
  EXPECT_EQ(view.sum().item<float>(), 40.0f);
}

// A view must lie within its buffer: a file that shrank between reading its header and mapping it used to give a
// view past the mapping's end, and a SIGBUS at the first read there (issue 22).
TEST(TensorOver, RefusesViewsPastTheBuffer) {
  auto buffer = std::make_shared<PinnedHostBuffer>(100, false);
  EXPECT_EQ(tensor_over(buffer, 0, {25}, {1}, at::kFloat).numel(), 25);
  EXPECT_EQ(tensor_over(buffer, 4, {4, 6}, {6, 1}, at::kFloat).numel(), 24);  // bytes 4 .. 100
  EXPECT_EQ(tensor_over(buffer, 100, {0, 6}, {6, 1}, at::kFloat).numel(), 0);
  for (const auto& [offset, sizes, strides] :
       std::vector<std::tuple<int64_t, std::vector<int64_t>, std::vector<int64_t>>>{
           {4, {25}, {1}}, {0, {5, 5}, {6, 1}}, {0, {2, 2}, {int64_t{1} << 61, 1}}, {0, {26}, {1}}}) {
    const std::string message = testing::error_of([&] { tensor_over(buffer, offset, sizes, strides, at::kFloat); });
    EXPECT_TRUE(message.find("past the end") != std::string::npos || message.find("overflows") != std::string::npos)
        << message;
  }
}

TEST(PinnedEmpty, ZeroRowsAndNegativeSizes) {
  EXPECT_EQ(pinned_empty({0, 8}, at::kFloat).numel(), 0);
  EXPECT_THROW(pinned_empty({-1, 8}, at::kFloat), c10::Error);
}

TEST(PinnedEmpty, SizesWhoseBytesOverflowAreRefused) {
  // 2^62 floats are 2^64 bytes: the count used to wrap to 0 and torch's from_blob then aborted the process.
  EXPECT_THROW(pinned_empty({int64_t{1} << 62}, at::kFloat), c10::Error);
  EXPECT_THROW(pinned_empty({int64_t{1} << 31, int64_t{1} << 31, 4}, at::kFloat), c10::Error);
  // A zero-size dimension makes no bytes, but the other sizes must still multiply out.
  EXPECT_EQ(pinned_empty({0, int64_t{1} << 40}, at::kFloat).numel(), 0);
}

TEST(TensorOver, ViewsMustFitTheirBuffer) {
  auto buffer = std::make_shared<PinnedHostBuffer>(64);
  EXPECT_EQ(tensor_over(buffer, 0, {4, 4}, {4, 1}, at::kFloat).numel(), 16);
  EXPECT_EQ(tensor_over(buffer, 64, {0, 4}, {4, 1}, at::kFloat).numel(), 0);
  EXPECT_THROW(tensor_over(buffer, 4, {4, 4}, {4, 1}, at::kFloat), c10::Error);   // one float past the end
  EXPECT_THROW(tensor_over(buffer, 0, {2, 4}, {16, 1}, at::kFloat), c10::Error);  // strided past the end
  EXPECT_THROW(tensor_over(buffer, 0, {int64_t{1} << 62, 2}, {2, 1}, at::kFloat), c10::Error);  // overflows
  EXPECT_THROW(tensor_over(buffer, 128, {0}, {1}, at::kFloat), c10::Error);  // offset outside
}

class ReadOnlyMappings : public speedtorch::testing::TempDirTest {
 protected:
  std::string file_of(std::size_t bytes) {
    const std::string p = path("t.bin");
    std::ofstream(p, std::ios::binary) << std::string(bytes, 'x');
    return p;
  }
};

// A mode 'r' mapping was registered only when CUDA pinned it, so without a GPU (or with pin=False) the operators
// could not know that they must not write it (issue 13).
TEST_F(ReadOnlyMappings, AreKnownPinnedOrNot) {
  const std::string file = file_of(10000);
  for (const bool pin : {false, true}) {
    const void* begin = nullptr;
    {
      PinnedHostBuffer buffer(file, FileMapping::kReadOnly, pin);
      begin = buffer.data();
      EXPECT_TRUE(is_read_only_host_memory(static_cast<const char*>(begin) + 9999)) << "pin " << pin;
      EXPECT_TRUE(is_device_read_only_host_memory(begin)) << "pin " << pin;
      const at::Tensor t = at::from_blob(buffer.data(), {10}, at::kByte);
      const std::string message = testing::error_of([&] { check_host_memory_writable(t, "test_op", "table"); });
      EXPECT_NE(message.find("test_op: table is a read-only file mapping"), std::string::npos) << message;
    }
    EXPECT_FALSE(is_read_only_host_memory(begin));  // the range may be reused by writable memory
  }
}

// A plain write into a mode 'r' mapping (torch has no read-only tensors) was a SIGSEGV; the pages are private now,
// as torch.load(mmap=True) maps them: the write stays in this process, the file never changes (issue 22).
TEST_F(ReadOnlyMappings, APlainWriteStaysInTheProcess) {
  const std::string file = file_of(10000);
  for (const bool pin : {false, true}) {
    PinnedHostBuffer buffer(file, FileMapping::kReadOnly, pin);
    std::memset(buffer.data(), 'y', 5000);
    EXPECT_EQ(static_cast<const char*>(buffer.data())[4999], 'y');
    std::ifstream in(file, std::ios::binary);
    const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(content, std::string(10000, 'x')) << "pin " << pin;
  }
}

TEST_F(ReadOnlyMappings, WritableMemoryIsNotReadOnly) {
  PinnedHostBuffer anonymous(4096);
  EXPECT_FALSE(is_read_only_host_memory(anonymous.data()));
  PinnedHostBuffer copy_on_write(file_of(100), FileMapping::kCopyOnWrite, false);
  EXPECT_FALSE(is_read_only_host_memory(copy_on_write.data()));
  PinnedHostBuffer shared(file_of(100), FileMapping::kReadWrite, false);
  EXPECT_FALSE(is_read_only_host_memory(shared.data()));
  const at::Tensor t = at::from_blob(shared.data(), {10}, at::kByte);
  EXPECT_EQ(testing::error_of([&] { check_host_memory_writable(t, "test_op", "table"); }), "");
}

}  // namespace
}  // namespace speedtorch

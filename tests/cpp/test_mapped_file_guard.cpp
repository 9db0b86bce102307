// Tests for csrc/io/mapped_file_guard: a save onto a file this process maps read-write writes the mapping back in
// place when it saves the mapped array itself, and is refused otherwise; other mappings do not matter.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/strides.h>

#include <memory>
#include <string>

#include "error_text.h"
#include "io/atomic_file.h"
#include "io/mapped_file_guard.h"
#include "io/npy_file.h"
#include "memory/pinned_host_buffer.h"
#include "temp_dir.h"

namespace speedtorch::io {
namespace {

using speedtorch::testing::error_of;

class MappedFileGuard : public speedtorch::testing::TempDirTest {
 protected:
  // A tensor over the whole array of the .npy file at `file`, mapped as `mapping`.
  static at::Tensor mapped(const std::string& file, FileMapping mapping) {
    auto buffer = std::make_shared<PinnedHostBuffer>(file, mapping, /*pin=*/false);
    const NpyHeader h = mapped_npy_header(buffer->data(), buffer->size(), file);
    return tensor_over(buffer, h.data_offset, h.shape, c10::contiguous_strides(h.shape), h.dtype);
  }
  static ino_t inode_of(const std::string& file) {
    struct stat st {};
    EXPECT_EQ(::stat(file.c_str(), &st), 0);
    return st.st_ino;
  }
};

TEST_F(MappedFileGuard, SavingTheMappedArrayWritesItBackInPlace) {
  const std::string file = path("t.npy");
  save_npy(at::arange(12, at::kFloat).reshape({4, 3}), file);
  const ino_t before = inode_of(file);
  at::Tensor t = mapped(file, FileMapping::kReadWrite);
  EXPECT_TRUE(saves_mapped_data_itself(file, t, "test"));
  t.fill_(2.0);
  save_npy(t, file);
  EXPECT_EQ(inode_of(file), before);  // the same file: the mapping still reaches it
  t[0][0] = 5.0;
  EXPECT_EQ(load_npy(file, false)[0][0].item<float>(), 5.0f);
  EXPECT_EQ(names(), std::vector<std::string>{"t.npy"});
}

TEST_F(MappedFileGuard, AnythingElseOntoAMappedFileIsRefusedBeforeAWrite) {
  const std::string file = path("t.npy");
  save_npy(at::ones({4, 3}), file);
  at::Tensor t = mapped(file, FileMapping::kReadWrite);
  ::link(file.c_str(), path("alias.npy").c_str());  // another name of the same file
  for (const at::Tensor& other : {at::zeros({4, 3}), t.narrow(0, 0, 2), t.t(), t.view(at::kInt)}) {
    for (const std::string& target : {file, path("alias.npy")}) {
      const std::string message = error_of([&] { save_npy(other, target); });
      EXPECT_NE(message.find("mapped read-write by this process"), std::string::npos) << message;
    }
  }
  EXPECT_NE(error_of([&] { write_file_atomically(file, "x", "test"); }).find("mapped read-write"),
            std::string::npos);
  EXPECT_EQ(names().size(), 2u);  // no temporary was made
  EXPECT_EQ(load_npy(file, false).sum().item<float>(), 12.0f);
}

TEST_F(MappedFileGuard, OtherMappingsAndDroppedOnesDoNotMatter) {
  const std::string file = path("t.npy");
  save_npy(at::ones({4, 3}), file);
  {
    at::Tensor read_only = mapped(file, FileMapping::kReadOnly);
    at::Tensor private_copy = mapped(file, FileMapping::kCopyOnWrite);
    EXPECT_FALSE(saves_mapped_data_itself(file, read_only, "test"));
    save_npy(at::zeros({2}), file);  // 'r' and 'c' mappings never write the file: replacing it loses nothing
    at::Tensor shared = mapped(file, FileMapping::kReadWrite);
  }
  save_npy(at::zeros({3}), file);  // the 'r+' mapping is gone
  EXPECT_EQ(load_npy(file, false).numel(), 3);
}

}  // namespace
}  // namespace speedtorch::io

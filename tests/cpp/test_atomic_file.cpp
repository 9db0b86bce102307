// Tests for csrc/io/atomic_file: replacing a file atomically and flushing its directory.
#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "error_text.h"
#include "io/atomic_file.h"
#include "temp_dir.h"

namespace speedtorch::io {
namespace {

using speedtorch::testing::error_of;

class AtomicFileTest : public speedtorch::testing::TempDirTest {};

TEST_F(AtomicFileTest, CommitReplacesTheTargetAndLeavesNoTemporary) {
  write_file_atomically(path("t.bin"), "abc", "test");
  EXPECT_EQ(names(), std::vector<std::string>{"t.bin"});
}

// A directory that cannot be flushed means the rename may not survive a crash: that is an error, not silence.
TEST_F(AtomicFileTest, SyncingAMissingDirectoryIsAnErrorNamingIt) {
  const std::string missing = path("no-such-dir");
  const std::string message = error_of([&] { sync_directory_of(missing + "/t.bin"); });
  EXPECT_NE(message.find(missing), std::string::npos) << message;
}

TEST_F(AtomicFileTest, SyncingAnExistingDirectoryWorks) {
  EXPECT_EQ(error_of([&] { sync_directory_of(path("t.bin")); }), "");
}

// fsync failures on a directory cannot be provoked portably: the check is tested on the result it is given.
TEST(DirectorySyncResult, FailureIsAnErrorNamingTheDirectoryAndCause) {
  const std::string message = error_of([] { check_directory_sync("/data/tables", -1, EIO); });
  EXPECT_NE(message.find("/data/tables"), std::string::npos) << message;
  EXPECT_NE(message.find("Input/output error"), std::string::npos) << message;
  EXPECT_EQ(error_of([] { check_directory_sync("/data/tables", 0, 0); }), "");
}

}  // namespace
}  // namespace speedtorch::io

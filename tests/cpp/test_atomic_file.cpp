// Tests for csrc/io/atomic_file: replacing a file atomically and flushing its directory.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <c10/core/ScalarType.h>

#include <cerrno>
#include <string>

#include "error_text.h"
#include "io/atomic_file.h"
#include "io/npy_file.h"
#include "temp_dir.h"

namespace speedtorch::io {
namespace {

using speedtorch::testing::error_of;

class AtomicFileTest : public speedtorch::testing::TempDirTest {};

TEST_F(AtomicFileTest, CommitReplacesTheTargetAndLeavesNoTemporary) {
  write_file_atomically(path("t.bin"), "abc", "test");
  EXPECT_EQ(names(), std::vector<std::string>{"t.bin"});
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Sets the process's umask for one test and restores it after.
class Umask {
 public:
  explicit Umask(mode_t mask) : old_(::umask(mask)) {}
  ~Umask() { ::umask(old_); }

 private:
  mode_t old_;
};

// One rule for every file speedtorch writes (io/file_mode.h): a replaced file keeps its mode, a new one gets the
// umask's (0666 less the umask, as open(2) and numpy.save give). A save used to turn a 0600 table into 0644, and
// create_zero_npy made 0600 files whatever the umask.
TEST_F(AtomicFileTest, AReplacedFileKeepsItsModeAndANewOneGetsTheUmasks) {
  Umask mask(022);
  write_file_atomically(path("t.bin"), "abc", "test");
  EXPECT_EQ(mode_of(path("t.bin")), 0644u);
  for (const unsigned mode : {0600u, 0640u, 0444u}) {
    ASSERT_EQ(::chmod(path("t.bin").c_str(), mode), 0);
    write_file_atomically(path("t.bin"), "abcd", "test");
    EXPECT_EQ(mode_of(path("t.bin")), mode);
  }
  {
    Umask strict(077);
    write_file_atomically(path("private.bin"), "abc", "test");
    EXPECT_EQ(mode_of(path("private.bin")), 0600u);
  }
  (void)create_zero_npy(path("zero.npy"), c10::ScalarType::Float, {4, 2});
  EXPECT_EQ(mode_of(path("zero.npy")), 0644u);
}

// While a save writes, a private file's rows are never readable by others: the temporary replacing an existing file
// is 0600 until finish() gives it the target's mode (it used to be 0644 for the whole write under umask 022).
TEST_F(AtomicFileTest, ATemporaryIsPrivateWhileItIsWritten) {
  Umask mask(022);
  write_file_atomically(path("t.bin"), "abc", "test");
  ASSERT_EQ(::chmod(path("t.bin").c_str(), 0600), 0);
  {
    AtomicFile file(path("t.bin"), "test");
    file.write("abcd", 4);
    EXPECT_EQ(mode_of(file.temp_path()), 0600u);
    file.finish();
    file.commit();
  }
  EXPECT_EQ(mode_of(path("t.bin")), 0600u);
  const std::string beside = create_temporary_beside(path("t.bin"), "test");
  EXPECT_EQ(mode_of(beside), 0600u);
  ASSERT_EQ(::chmod(path("t.bin").c_str(), 0644), 0);
  replace_file(beside, path("t.bin"), "test");
  EXPECT_EQ(mode_of(path("t.bin")), 0644u);
  {
    AtomicFile fresh(path("new.bin"), "test");  // nothing to keep private: a new file's mode from the start
    EXPECT_EQ(mode_of(fresh.temp_path()), 0644u);
  }
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

// Atomic file replacement: temporary + fsync + rename + directory fsync (see atomic_file.h).
#include "io/atomic_file.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "io/file_mode.h"
#include "io/mapped_file_guard.h"

namespace speedtorch::io {
namespace {

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  TORCH_CHECK(!path_.empty(), what_, ": the path is empty");
  check_not_mapped_read_write(path_, what_);  // refused before anything is written
  static std::atomic<uint64_t> counter{0};
  // Beside the target, so the rename stays within one file system (and so is atomic).
  temp_path_ = path_ + ".tmp-" + std::to_string(getpid()) + "-" + std::to_string(counter.fetch_add(1));
  fd_ = open_new_file(temp_path_);
  TORCH_CHECK(fd_ >= 0, what_, ": cannot create ", temp_path_, " (beside ", path_, "): ", std::strerror(errno),
              "; the directory must exist and be writable");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::write(const void* data, std::size_t size) {
  TORCH_CHECK(fd_ >= 0 && !finished_, what_, ": write after finish()");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min<std::size_t>(size, std::size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n > 0, what_, ": writing ", temp_path_, " failed: ", std::strerror(errno), "; ", path_,
                " is untouched");
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::finish() {
  TORCH_CHECK(!finished_, what_, ": finish() called twice");
  keep_mode_of(path_, fd_, what_);
  TORCH_CHECK(::fsync(fd_) == 0, what_, ": flushing ", temp_path_, " to disk failed: ", std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  TORCH_CHECK(rc == 0, what_, ": closing ", temp_path_, " failed: ", std::strerror(errno));
  finished_ = true;
}

void AtomicFile::commit(bool sync_directory) {
  TORCH_CHECK(finished_, what_, ": commit() before finish()");
  TORCH_CHECK(!committed_, what_, ": commit() called twice");
  check_not_mapped_read_write(path_, what_);  // a mapping may have appeared while the temporary was written
  TORCH_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, what_, ": renaming ", temp_path_, " to ", path_,
              " failed: ", std::strerror(errno));
  committed_ = true;
  if (sync_directory) sync_directory_of(path_);
}

void check_directory_sync(const std::string& directory, int fsync_result, int fsync_errno) {
  TORCH_CHECK(fsync_result == 0, "speedtorch: flushing directory ", directory, " to disk (fsync) failed: ",
              std::strerror(fsync_errno), "; the files just renamed into it may not survive a crash");
}

void sync_directory_of(const std::string& path) {
  // The rename itself must reach the disk for the new file to survive a crash.
  const std::string directory = directory_of(path);
  const int dir = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TORCH_CHECK(dir >= 0, "speedtorch: cannot open directory ", directory, " to flush it to disk: ",
              std::strerror(errno));
  const int rc = ::fsync(dir);
  const int err = errno;
  ::close(dir);
  check_directory_sync(directory, rc, err);
}

void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what) {
  AtomicFile file(path, what);
  file.write(bytes.data(), bytes.size());
  file.finish();
  file.commit();
}

}  // namespace speedtorch::io

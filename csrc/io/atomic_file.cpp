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

// A new, empty temporary beside `path` (so the rename stays within one file system, and so is atomic), unique to
// this call: the process id and a process-wide counter name it, O_EXCL makes sure. Private (0600) while written
// when it replaces a file; keep_mode_of gives it the final mode. Returns its descriptor.
int create_temporary(const std::string& path, const std::string& what, std::string& temp_path) {
  TORCH_CHECK(!path.empty(), what, ": the path is empty");
  static std::atomic<uint64_t> counter{0};
  temp_path = path + ".tmp-" + std::to_string(getpid()) + "-" + std::to_string(counter.fetch_add(1));
  const int fd = open_temporary_for(path, temp_path);
  TORCH_CHECK(fd >= 0, what, ": cannot create ", temp_path, " (beside ", path, "): ", std::strerror(errno),
              "; the directory must exist and be writable");
  return fd;
}

void fsync_or_throw(int fd, const std::string& file, const std::string& what) {
  TORCH_CHECK(::fsync(fd) == 0, what, ": flushing ", file, " to disk failed: ", std::strerror(errno));
}

void rename_over(const std::string& temp_path, const std::string& path, const std::string& what) {
  check_not_mapped_read_write(path, what);  // a mapping may have appeared while the temporary was written
  TORCH_CHECK(::rename(temp_path.c_str(), path.c_str()) == 0, what, ": renaming ", temp_path, " to ", path,
              " failed: ", std::strerror(errno));
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  TORCH_CHECK(!path_.empty(), what_, ": the path is empty");
  check_not_mapped_read_write(path_, what_);  // refused before anything is written
  fd_ = create_temporary(path_, what_, temp_path_);
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
  fsync_or_throw(fd_, temp_path_, what_);
  const int rc = ::close(fd_);
  fd_ = -1;
  TORCH_CHECK(rc == 0, what_, ": closing ", temp_path_, " failed: ", std::strerror(errno));
  finished_ = true;
}

void AtomicFile::commit(bool sync_directory) {
  TORCH_CHECK(finished_, what_, ": commit() before finish()");
  TORCH_CHECK(!committed_, what_, ": commit() called twice");
  rename_over(temp_path_, path_, what_);
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

std::string create_temporary_beside(const std::string& path, const std::string& what) {
  check_not_mapped_read_write(path, what);
  std::string temp_path;
  ::close(create_temporary(path, what, temp_path));
  return temp_path;
}

void replace_file(const std::string& temporary, const std::string& path, const std::string& what) {
  const int fd = ::open(temporary.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, what, ": cannot open ", temporary, ": ", std::strerror(errno));
  try {
    keep_mode_of(path, fd, what);
    fsync_or_throw(fd, temporary, what);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  rename_over(temporary, path, what);
  sync_directory_of(path);
}

void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what) {
  AtomicFile file(path, what);
  file.write(bytes.data(), bytes.size());
  file.finish();
  file.commit();
}

}  // namespace speedtorch::io

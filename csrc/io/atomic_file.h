// A file written so that readers see the old version or the new one, never a mix: the bytes go to a temporary
// beside the target, finish() flushes it to disk, commit() renames it over the target and flushes the directory. A
// crash, an error or destruction before commit() leaves the target untouched (the temporary is removed when this
// object is destroyed). The new file has the permissions of the one it replaces, or a new file's (io/file_mode.h);
// a target this process maps read-write is never replaced (io/mapped_file_guard.h).
#pragma once

#include <cstddef>
#include <string>

namespace speedtorch::io {

class AtomicFile {
 public:
  // `what` names the operation in errors ("speedtorch.save_npy").
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t size);
  // fsync + close the temporary.
  void finish();
  // Renames the finished temporary over the target and, unless told not to, fsyncs the directory. Several files
  // replaced together (a table's save) are renamed back to back and the directory synced once, after the last.
  void commit(bool sync_directory = true);

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  std::string path_;
  std::string what_;
  std::string temp_path_;
  int fd_ = -1;
  bool finished_ = false;
  bool committed_ = false;
};

// Flushes the directory holding `path` to disk, so renames into it survive a crash. Throws c10::Error naming the
// directory when it cannot be opened or flushed.
void sync_directory_of(const std::string& path);

// Throws c10::Error naming `directory` and the cause unless `fsync_result` (fsync's return value, with its errno)
// reports success. Separate so that the failure path, which no test can provoke on a healthy disk, is tested.
void check_directory_sync(const std::string& directory, int fsync_result, int fsync_errno);

// For bytes another library writes (speedtorch.jit_save): an empty temporary beside `path`, unique to this call,
// private (0600) when it will replace a file, else with a new file's permissions; returns its name. replace_file(temporary, path) then does what finish() and commit() do.
std::string create_temporary_beside(const std::string& path, const std::string& what);
void replace_file(const std::string& temporary, const std::string& path, const std::string& what);

// Writes `bytes` to `path` atomically (AtomicFile, finished and committed).
void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what);

}  // namespace speedtorch::io

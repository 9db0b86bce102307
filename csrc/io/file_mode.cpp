// File permissions: new files get the umask's mode, replacements keep the replaced file's (see file_mode.h).
#include "io/file_mode.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace speedtorch::io {
namespace {

// open(2) takes the umask off this, as for any program's new files.
constexpr mode_t kNewFileMode = 0666;

std::string octal(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "0%o", static_cast<unsigned>(mode));
  return text;
}

}  // namespace

int open_new_file(const std::string& path, bool owner_only) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, owner_only ? 0600 : kNewFileMode);
}

int open_temporary_for(const std::string& target, const std::string& temp_path) {
  struct stat st {};
  return open_new_file(temp_path, /*owner_only=*/::stat(target.c_str(), &st) == 0);
}

void keep_mode_of(const std::string& target, int fd, const std::string& what) {
  struct stat st {};
  if (::stat(target.c_str(), &st) != 0) {
    TORCH_CHECK(errno == ENOENT, what, ": cannot read the permissions of ", target, ": ", std::strerror(errno));
    return;  // a new file: the umask's mode, from open_new_file
  }
  TORCH_CHECK(::fchmod(fd, st.st_mode & 07777) == 0, what, ": cannot give the new ", target, " the permissions of "
              "the file it replaces (", octal(st.st_mode & 07777), "): ", std::strerror(errno));
}

}  // namespace speedtorch::io

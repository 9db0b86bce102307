// The permissions of every file speedtorch writes, one rule for all: a file that replaces another (a save renamed
// over the old one) keeps the mode of the file it replaces; a new file gets the mode open(2) gives, 0666 less the
// process's umask, as numpy.save and torch.save give theirs. A save never makes a private (0600) table readable by
// others, and never makes a new file more private than the user's umask asks.
#pragma once

#include <string>

namespace speedtorch::io {

// Creates `path`, which must not exist (O_EXCL: never truncates or takes over anyone's file), write-only and
// close-on-exec, with the mode of a new file, or 0600 when `owner_only`. Returns the descriptor, or -1 with errno set
// (callers say what failed).
int open_new_file(const std::string& path, bool owner_only = false);

// A temporary that will replace `target`: 0600 while it is written when `target` exists (keep_mode_of gives it the
// target's mode once written, so a private table is never readable by others mid-save), else a new file's mode.
int open_temporary_for(const std::string& target, const std::string& temp_path);

// Gives the file open on `fd`, which is about to replace `target` (a temporary renamed over it), the permission bits
// `target` has, when `target` exists; a new target keeps what open_new_file gave. Throws c10::Error naming `what`.
void keep_mode_of(const std::string& target, int fd, const std::string& what);

}  // namespace speedtorch::io

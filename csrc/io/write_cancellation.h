// Cancelling file writes in progress: a long save (a table of many gigabytes) stops at its next chunk, leaving the
// target files as they were (NpyWriter writes through a temporary; io/atomic_file.h), instead of running on to
// commit after the user asked it to stop. Python asks on Ctrl-C: speedtorch's save wrappers run the save in a
// worker thread, and a KeyboardInterrupt in the waiting thread calls speedtorch::cancel_writes (speedtorch/_interrupt.py);
// csrc/ itself never looks at signals.
//
// Cancelling is process-wide and covers the writes started before the request: each write remembers the
// cancellation count when it starts and stops once the count has moved. Writes started afterwards run normally.
#pragma once

#include <cstdint>
#include <string>

namespace speedtorch::io {

// Stops every file write in progress at its next chunk (it raises, naming the file; nothing is committed).
void cancel_writes_in_progress();

// A write's view of the requests: created when the write starts, checked between chunks.
class WriteCancellation {
 public:
  WriteCancellation();
  // Raises c10::Error ("... was cancelled ...", naming `path`) if a cancellation was requested since construction.
  void check(const std::string& path) const;

 private:
  uint64_t start_count_;
};

}  // namespace speedtorch::io

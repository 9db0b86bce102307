// Cancellation of file writes in progress (see write_cancellation.h).
#include "io/write_cancellation.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace speedtorch::io {
namespace {

std::atomic<uint64_t>& cancellation_count() {
  static std::atomic<uint64_t> count{0};
  return count;
}

}  // namespace

void cancel_writes_in_progress() { cancellation_count().fetch_add(1, std::memory_order_relaxed); }

WriteCancellation::WriteCancellation() : start_count_(cancellation_count().load(std::memory_order_relaxed)) {}

void WriteCancellation::check(const std::string& path) const {
  TORCH_CHECK(cancellation_count().load(std::memory_order_relaxed) == start_count_, "speedtorch: writing ", path,
              " was cancelled (KeyboardInterrupt); nothing was committed, the files at that path are as they were");
}

}  // namespace speedtorch::io

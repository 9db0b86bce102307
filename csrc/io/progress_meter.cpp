// Progress line on stderr for long transfers (see progress_meter.h).
#include "io/progress_meter.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace speedtorch::io {
namespace {

int progress_mode() {
  const char* env = std::getenv("SPEEDTORCH_PROGRESS");
  if (env == nullptr || *env == '\0') return 1;
  if (std::strcmp(env, "0") == 0) return 0;
  if (std::strcmp(env, "1") == 0) return 2;
  return 1;
}

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

ProgressMeter::ProgressMeter(std::string what, int64_t total_bytes)
    : what_(std::move(what)),
      total_(total_bytes),
      mode_(progress_mode()),
      tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

ProgressMeter::~ProgressMeter() {
  if (printed_) print(true);
}

void ProgressMeter::advance(int64_t bytes) {
  done_ += bytes;
  if (mode_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (mode_ == 1 && seconds(now - start_) < 1.0) return;
  if (tty_) {
    if (printed_ && seconds(now - last_print_) < 0.25) return;
  } else {
    const int decile = total_ > 0 ? static_cast<int>(done_ * 10 / total_) : 10;
    if (decile == last_decile_) return;
    last_decile_ = decile;
  }
  last_print_ = now;
  print(false);
}

void ProgressMeter::print(bool final_line) {
  const double elapsed = seconds(std::chrono::steady_clock::now() - start_);
  const double gb = 1e-9;
  const double rate = elapsed > 0 ? done_ * gb / elapsed : 0.0;
  const double percent = total_ > 0 ? 100.0 * done_ / total_ : 100.0;
  if (final_line) {
    std::fprintf(stderr, "%sspeedtorch: %s: %.2f GB in %.1f s (%.2f GB/s)%s\n", tty_ ? "\r" : "", what_.c_str(),
                 done_ * gb, elapsed, rate, done_ < total_ ? ", stopped early" : "");
  } else {
    const double eta = rate > 0 ? (total_ - done_) * gb / rate : 0.0;
    std::fprintf(stderr, "%sspeedtorch: %s %3.0f%%  %.2f/%.2f GB  %.2f GB/s  %.0f s left%s", tty_ ? "\r" : "",
                 what_.c_str(), percent, done_ * gb, total_ * gb, rate, eta, tty_ ? "" : "\n");
  }
  std::fflush(stderr);
  printed_ = true;
}

}  // namespace speedtorch::io

// A progress line on stderr for long file transfers (saving and loading tables), so a multi-gigabyte save does not
// look hung. Silent for short runs: the first line appears once a run has taken over a second, and is refreshed at
// most 4 times a second ('\r' on a terminal, a line per 10% otherwise). SPEEDTORCH_PROGRESS=0 silences it,
// SPEEDTORCH_PROGRESS=1 shows it for every run. Written from C++ so TorchScript and C++ servers get it too.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace speedtorch::io {

class ProgressMeter {
 public:
  // `what`: e.g. "saving users.npy"; `total_bytes`: the work's size.
  ProgressMeter(std::string what, int64_t total_bytes);
  ~ProgressMeter();
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  void advance(int64_t bytes);

 private:
  void print(bool final_line);

  std::string what_;
  int64_t total_;
  int64_t done_ = 0;
  int mode_;  // 0: silent, 1: after a second, 2: always
  bool tty_;
  bool printed_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
};

}  // namespace speedtorch::io

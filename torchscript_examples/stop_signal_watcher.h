// StopSignalWatcher: turns SIGTERM / SIGINT into a call on an ordinary thread. A signal handler may only call
// async-signal-safe functions, and stopping a server (locks, socket calls, a live object) is not one.
// So the signals are blocked in every thread and one thread takes them with sigwait, then runs the callback.
//
// block_stop_signals() must run first in main, before any thread starts (torch's pools included): threads inherit
// the mask, so no thread of the process can be picked to run the default action (death) for these signals.
#pragma once

#include <pthread.h>

#include <atomic>
#include <functional>
#include <thread>

namespace speedtorch::serving {

// Blocks SIGTERM and SIGINT in the calling thread (and so in every thread it starts from now on).
void block_stop_signals();

class StopSignalWatcher {
 public:
  // Starts the thread that waits for SIGTERM / SIGINT and then calls on_signal(signal number), once.
  explicit StopSignalWatcher(std::function<void(int)> on_signal);
  // Joins the thread (waking it if no signal came).
  ~StopSignalWatcher();
  StopSignalWatcher(const StopSignalWatcher&) = delete;
  StopSignalWatcher& operator=(const StopSignalWatcher&) = delete;

 private:
  std::function<void(int)> on_signal_;
  std::atomic<bool> closing_{false};
  std::thread waiter_;
};

}  // namespace speedtorch::serving

// StopSignalWatcher (see stop_signal_watcher.h).
#include "stop_signal_watcher.h"

#include <csignal>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace speedtorch::serving {
namespace {

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

void check(int error, const char* what) {
  if (error != 0) throw std::runtime_error(std::string("StopSignalWatcher: ") + what + ": " + std::strerror(error));
}

}  // namespace

void block_stop_signals() {
  const sigset_t set = stop_signals();
  check(pthread_sigmask(SIG_BLOCK, &set, nullptr), "pthread_sigmask");
}

StopSignalWatcher::StopSignalWatcher(std::function<void(int)> on_signal) : on_signal_(std::move(on_signal)) {
  waiter_ = std::thread([this] {
    const sigset_t set = stop_signals();
    int signal = 0;
    // sigwait only fails for an invalid set; retry on anything else rather than miss a stop.
    while (sigwait(&set, &signal) != 0) {
    }
    if (!closing_.load()) on_signal_(signal);
  });
}

StopSignalWatcher::~StopSignalWatcher() {
  closing_.store(true);
  // The signal is blocked everywhere, so this only wakes the waiter's sigwait (it is a no-op if a signal came).
  pthread_kill(waiter_.native_handle(), SIGTERM);
  waiter_.join();
}

}  // namespace speedtorch::serving

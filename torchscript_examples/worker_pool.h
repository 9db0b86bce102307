// WorkerPool: a fixed set of threads running tasks in the order they are queued. The HTTP server's event loop
// hands it whatever takes longer than a few microseconds (reading a JSON body, a top-k, an update) so that the loop
// never waits. `init_thread` runs first in each thread (the server gives each worker its own CUDA stream there).
// The destructor runs every queued task, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace speedtorch::serving {

class WorkerPool {
 public:
  WorkerPool(int threads, std::function<void()> init_thread) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this, init_thread] {
        if (init_thread) init_thread();
        std::unique_lock<std::mutex> lock(mutex_);
        while (true) {
          wake_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
          if (tasks_.empty()) return;  // stopping, nothing left
          std::function<void()> task = std::move(tasks_.front());
          tasks_.pop_front();
          lock.unlock();
          task();  // tasks catch their own exceptions (server_main.cpp)
          lock.lock();
        }
      });
    }
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void run(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    wake_.notify_one();
  }

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace speedtorch::serving

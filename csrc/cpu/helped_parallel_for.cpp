// A parallel loop that never waits for a thread the scheduler has not run yet (see helped_parallel_for.h).
#include "cpu/helped_parallel_for.h"

#include <ATen/Parallel.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

namespace speedtorch {
namespace {

// What the calling thread and its helpers share. A helper holds it alive after the call may have returned; it
// touches `fn` only after it has taken a chunk, and the call does not return before every chunk taken is done.
struct Chunks {
  Chunks(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>* fn)
      : count(count), grain(grain), total((count + grain - 1) / grain), fn(fn) {}
  const int64_t count;
  const int64_t grain;
  const int64_t total;
  const std::function<void(int64_t, int64_t)>* const fn;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

void take_chunks(Chunks& chunks) {
  for (;;) {
    const int64_t c = chunks.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= chunks.total) return;
    const int64_t begin = c * chunks.grain;
    (*chunks.fn)(begin, std::min(chunks.count, begin + chunks.grain));
    chunks.done.fetch_add(1, std::memory_order_release);  // publishes the chunk's writes to the waiting caller
  }
}

// The helpers: threads of speedtorch's own, started when first asked for (as many as ever asked for at once), each
// waiting for work on a condition variable. Not PyTorch's inter-op pool (at::launch): starting that one fixes its
// size, so a later torch.set_num_interop_threads would raise, and TorchScript's forks queue there.
class HelperThreads {
 public:
  // Asks `count` helpers to take chunks of `chunks`. Never throws: without threads, the caller does every chunk.
  void post(int64_t count, const std::shared_ptr<Chunks>& chunks) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int64_t i = 0; i < count; ++i) queue_.push_back(chunks);
      try {
        for (; threads_ < count; ++threads_) std::thread([this] { serve(); }).detach();
      } catch (const std::system_error&) {  // no more threads to be had: fewer helpers
      }
    }
    if (count == 1) {
      wake_.notify_one();
    } else {
      wake_.notify_all();
    }
  }

 private:
  void serve() {
    for (;;) {
      std::shared_ptr<Chunks> chunks;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return !queue_.empty(); });
        chunks = std::move(queue_.front());
        queue_.pop_front();
      }
      take_chunks(*chunks);  // a call already finished leaves nothing to take
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Chunks>> queue_;
  int64_t threads_ = 0;
};

// Never destroyed: its threads wait on it until the process ends. A forked child has none of its threads, and
// perhaps a lock another thread held at the fork: it starts a new one (the old one is left as it is).
HelperThreads* helper_threads_instance = nullptr;

HelperThreads& helper_threads() {
  static std::once_flag once;
  std::call_once(once, [] {
    helper_threads_instance = new HelperThreads;
    pthread_atfork(nullptr, nullptr, [] { helper_threads_instance = new HelperThreads; });
  });
  return *helper_threads_instance;
}

thread_local int t_thread_count = 0;  // HelpedThreadCount's, 0: at::get_num_threads()

}  // namespace

int helped_thread_count() { return t_thread_count > 0 ? t_thread_count : at::get_num_threads(); }

HelpedThreadCount::HelpedThreadCount(int threads) : previous_(t_thread_count) { t_thread_count = threads; }
HelpedThreadCount::~HelpedThreadCount() { t_thread_count = previous_; }

void helped_parallel_for(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (count <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t helpers = std::min<int64_t>(helped_thread_count() - 1, (count - 1) / grain);
  if (helpers <= 0 || at::in_parallel_region()) return fn(0, count);
  auto chunks = std::make_shared<Chunks>(count, grain, &fn);
  helper_threads().post(helpers, chunks);
  take_chunks(*chunks);
  // Every chunk is taken: wait for those a running helper is still on (short: a chunk is a few microseconds).
  while (chunks->done.load(std::memory_order_acquire) < chunks->total) std::this_thread::yield();
}

}  // namespace speedtorch

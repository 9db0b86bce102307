// A parallel loop that never waits for a thread the scheduler has not run yet.
//
// at::parallel_for (OpenMP) hands each thread its share up front and joins them all: on a loaded machine the
// calling thread then waits, its own share done, for a thread that has not been scheduled yet, for milliseconds
// (issue 23 item 7: a 512 KiB gather took 5 ms with 2 threads on a machine with a load average of 10, 20 us
// alone). helped_parallel_for lets the calling thread take chunks from a shared counter, and asks helper threads
// (speedtorch's own, started on first use, waiting on a condition variable) to take chunks too: a helper that starts
// late finds the chunks taken and leaves. The call returns once every chunk taken is done, so it waits only for
// helpers that are running. On an idle machine the helpers arrive within microseconds and take their share.
//
// The row copies (cpu/row_copy_cpu.cpp) use it for every copy above 1 MiB, the staged share of a transfer among
// them: at::parallel_for's wait for an unscheduled thread is a scheduling period (24 ms on a machine of 8 CPUs or
// more) whatever the size of the work, and that share is on the critical path of every split transfer (issue 30).
#pragma once

#include <cstdint>
#include <functional>

namespace speedtorch {

// fn(begin, end) over [0, count) in chunks of `grain` (the last one shorter), each chunk exactly once, on the
// calling thread and on up to at::get_num_threads() - 1 helpers. With one thread, or inside a parallel region, one
// call fn(0, count) on the calling thread. fn must not throw.
void helped_parallel_for(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// The threads helped_parallel_for takes on this thread, the calling one included (HelpedThreadCount's, else
// at::get_num_threads()).
int helped_thread_count();

// While it lives, helped_parallel_for on this thread takes `threads` (the calling thread included) in place of
// at::get_num_threads(): for work one thread hands to another (a host function in a CUDA stream,
// transfer/stream_ordered_staging.h) with the thread count in force where it was asked for.
class HelpedThreadCount {
 public:
  explicit HelpedThreadCount(int threads);
  ~HelpedThreadCount();
  HelpedThreadCount(const HelpedThreadCount&) = delete;
  HelpedThreadCount& operator=(const HelpedThreadCount&) = delete;

 private:
  int previous_;
};

}  // namespace speedtorch

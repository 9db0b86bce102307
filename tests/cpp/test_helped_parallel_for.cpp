// Tests for csrc/cpu/helped_parallel_for: every chunk exactly once, whatever the threads, and helpers that start
// after the call has returned touch nothing of it.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cpu/helped_parallel_for.h"

namespace speedtorch {
namespace {

// Sets torch's intra-op thread count for a test, and puts it back.
class ThreadCount {
 public:
  explicit ThreadCount(int threads) : previous_(at::get_num_threads()) { at::set_num_threads(threads); }
  ~ThreadCount() { at::set_num_threads(previous_); }

 private:
  int previous_;
};

class HelpedParallelFor : public ::testing::TestWithParam<int> {};

TEST_P(HelpedParallelFor, CoversEveryItemOnceInWholeChunks) {
  ThreadCount threads(GetParam());
  for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
    for (const int64_t grain : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{1} << 20}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(count));
      std::atomic<int64_t> calls{0};
      std::atomic<bool> bad_range{false};
      helped_parallel_for(count, grain, [&](int64_t begin, int64_t end) {
        // The whole range in one call (one thread, or one chunk), or chunks that start on a multiple of the grain
        // and end at the next one (or at count).
        const bool whole = begin == 0 && end == count;
        if (!whole && (begin < 0 || begin >= end || begin % grain != 0 || end != std::min(count, begin + grain))) {
          bad_range = true;
        }
        if (calls.fetch_add(1) > 0 && (whole || grain >= count)) bad_range = true;
        for (int64_t i = begin; i < end && i < count; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
      });
      EXPECT_FALSE(bad_range) << "count " << count << " grain " << grain;
      int64_t wrong = 0;
      for (auto& s : seen) wrong += s.load() != 1;
      EXPECT_EQ(wrong, 0) << "items not covered exactly once; count " << count << " grain " << grain;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, HelpedParallelFor, ::testing::Values(1, 2, 4));

TEST(HelpedParallelForAlone, AGrainOfZeroIsOneItemAChunk) {
  ThreadCount threads(2);
  std::vector<std::atomic<int>> seen(5);
  helped_parallel_for(5, 0, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(end, begin + 1);
    seen[static_cast<size_t>(begin)].fetch_add(1);
  });
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}

// A helper that starts after the call has returned, its function and captures gone, must find the chunks taken and
// leave without calling it (ASan would see a call into the freed std::function). To get one: a first call, on
// another thread, keeps every helper thread busy in one of its chunks until released (with 8 threads it asks for 7
// helpers, and the helper threads are as many as ever asked for: 7, the most any test here asks for); meanwhile a
// second call's helpers can only queue, so the second caller does every chunk alone and returns; then the helpers
// are released and reach the second call's queued requests.
TEST(HelpedParallelForAlone, ReturnsWithoutWaitingForHelpersThatHaveNotStarted) {
  constexpr int kHelpers = 7;
  ThreadCount threads(kHelpers + 1);
  struct Signals {  // shared with the threads, which may read it after their last signal
    std::atomic<int> helpers_busy{0};
    std::atomic<bool> release{false};
  };
  auto signals = std::make_shared<Signals>();
  auto wait_for = [](const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return done();
  };
  auto all_busy = [signals] { return signals->helpers_busy.load() == kHelpers; };

  std::thread first([signals, wait_for, all_busy] {
    const std::thread::id self = std::this_thread::get_id();
    helped_parallel_for(kHelpers + 1, 1, [&](int64_t, int64_t) {
      if (std::this_thread::get_id() == self) {
        wait_for(all_busy);  // leave the other chunks to the helpers, one each
        return;
      }
      signals->helpers_busy.fetch_add(1);
      wait_for([&] { return signals->release.load(); });
    });
  });
  ASSERT_TRUE(wait_for(all_busy)) << "the helper threads did not all start";

  std::vector<int> seen(1000, 0);  // plain ints: only the calling thread may write them
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> other_thread{false};
  {
    auto fn = std::make_unique<std::function<void(int64_t, int64_t)>>([&](int64_t begin, int64_t end) {
      if (std::this_thread::get_id() != caller) other_thread = true;
      for (int64_t i = begin; i < end; ++i) ++seen[static_cast<size_t>(i)];
    });
    helped_parallel_for(1000, 10, *fn);
  }  // fn destroyed: a helper that called it now would use freed memory
  EXPECT_FALSE(other_thread.load());
  for (int s : seen) ASSERT_EQ(s, 1);

  signals->release = true;  // the helpers finish the first call's chunks, then take the second call's requests
  first.join();
  // One more call that they may share, after which the stale requests are surely consumed.
  std::atomic<int64_t> sum{0};
  helped_parallel_for(100, 1, [&](int64_t begin, int64_t end) { sum += end - begin; });
  EXPECT_EQ(sum.load(), 100);
  EXPECT_FALSE(other_thread.load());
}

TEST(HelpedParallelForAlone, RunsOnTheCallingThreadInsideAParallelRegion) {
  ThreadCount threads(2);
  std::atomic<int> calls{0};
  at::parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    if (!at::in_parallel_region()) return;  // a build whose parallel_for ran inline: nothing to check
    const std::thread::id here = std::this_thread::get_id();
    helped_parallel_for(1000, 10, [&](int64_t begin, int64_t end) {
      EXPECT_EQ(std::this_thread::get_id(), here);
      EXPECT_EQ(begin, 0);
      EXPECT_EQ(end, 1000);
      calls.fetch_add(1);
    });
  });
  EXPECT_LE(calls.load(), 2);
}

}  // namespace
}  // namespace speedtorch

// What the library counters (csrc/metrics/transfer_counters.h) cost in C++, with no Python in the way: the
// counting calls a gather makes, timed with counting on and off, on 1 thread and on several threads adding to the
// same counters at once (the contended case sharding would help); and a small CPU gather through the dispatcher
// with counting on and off. Side by side in one run, with differences and ratios.
//
// Each figure is the minimum over rounds of the mean per call in a round (rounds alternate on/off), the least
// disturbed estimate on a shared machine; the median is printed beside it.
//
//   build/speedtorch_metrics_bench [threads=2] [rounds=21]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "metrics/transfer_counters.h"
#include "row_ops.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace metrics = speedtorch::metrics;

// Mean ns per call of `fn` over `calls` calls, on each of `threads` threads at once (the slowest thread's mean).
double ns_per_call(const std::function<void()>& fn, int64_t calls, int threads) {
  std::vector<double> ns(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const auto start = Clock::now();
      for (int64_t i = 0; i < calls; ++i) fn();
      ns[t] = std::chrono::duration<double, std::nano>(Clock::now() - start).count() / calls;
    });
  }
  for (std::thread& th : pool) th.join();
  return *std::max_element(ns.begin(), ns.end());
}

struct Figures {
  double min_on, min_off, median_on, median_off;
};

Figures on_off(const std::function<void()>& fn, int64_t calls, int threads, int rounds) {
  std::vector<double> on, off;
  for (int r = 0; r < rounds; ++r) {
    for (bool enabled : {r % 2 == 0, r % 2 != 0}) {
      metrics::set_enabled(enabled);
      (enabled ? on : off).push_back(ns_per_call(fn, calls, threads));
    }
  }
  metrics::set_enabled(true);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {*std::min_element(on.begin(), on.end()), *std::min_element(off.begin(), off.end()), median(on),
          median(off)};
}

void print(const char* what, int threads, const Figures& f) {
  std::printf("%-44s %7d %9.1f %9.1f %9.1f %9.3f %11.1f %11.1f\n", what, threads, f.min_off, f.min_on,
              f.min_on - f.min_off, f.min_on / f.min_off, f.median_off, f.median_on);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 21;
  at::set_num_threads(1);  // the gather's own threads would compete with the bench's
  std::printf("%-44s %7s %9s %9s %9s %9s %11s %11s\n", "calls (ns per call)", "threads", "min off", "min on",
              "on-off", "on/off", "median off", "median on");
  // What one pinned->GPU gather adds: the call and its UVA and staged shares (rows + bytes each).
  const auto counting = [] {
    metrics::add_rows_moved(metrics::TransferPath::kUva, metrics::Direction::kGather, 96, 512);
    metrics::add_rows_moved(metrics::TransferPath::kStaged, metrics::Direction::kGather, 32, 512);
    metrics::add_transfer_call(metrics::Direction::kGather);
  };
  print("counting of one gather (5 atomic adds)", 1, on_off(counting, 2'000'000, 1, rounds));
  print("counting of one gather, same counters", threads, on_off(counting, 1'000'000, threads, rounds));
  const at::Tensor table = at::randn({100'000, 32});
  const at::Tensor idx = at::randint(0, 100'000, {16}, at::kLong);
  const auto gather = [&] { speedtorch::ops::gather(table, idx); };
  print("speedtorch::gather CPU, 16 x 32 float rows", 1, on_off(gather, 20'000, 1, rounds));
  return 0;
}

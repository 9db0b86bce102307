// Tests for RequestBatcher: concurrent requests are merged into fewer model calls, each gets exactly its own part
// of the answer, the window bounds the wait, a failing model call fails only its batch, and the destructor answers
// what is queued.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "request_batcher.h"
#include "request_metrics.h"

namespace speedtorch::serving {
namespace {

// A "model" whose answer identifies each id: row i of the table is (i, i + 0.5); scores are users * 1000 + items.
torch::Tensor rows_of(const torch::Tensor& ids, const torch::Tensor&) {
  const torch::Tensor f = ids.to(torch::kFloat).unsqueeze(1);
  return torch::cat({f, f + 0.5}, 1);
}
torch::Tensor scores_of(const torch::Tensor& users, const torch::Tensor& items) {
  return (users * 1000 + items).to(torch::kFloat);
}

TEST(RequestBatcher, MergesConcurrentRequestsAndSplitsTheAnswers) {
  std::atomic<int> calls{0};
  std::mutex mutex;
  std::vector<int64_t> batch_sizes;
  RequestMetrics metrics({});
  RequestBatcher::Options options;
  options.window = std::chrono::milliseconds(50);  // long: every request below arrives within it
  options.runners = 1;
  RequestBatcher batcher(
      [&](const torch::Tensor& ids, const torch::Tensor& items) {
        ++calls;
        std::lock_guard<std::mutex> lock(mutex);
        batch_sizes.push_back(ids.numel());
        return rows_of(ids, items);
      },
      scores_of, options, &metrics);
  constexpr int kRequests = 16;
  std::vector<std::promise<torch::Tensor>> answers(kRequests);
  for (int r = 0; r < kRequests; ++r) batcher.announce();  // all on their way: the batch waits for them
  for (int r = 0; r < kRequests; ++r) {
    // Request r asks for r + 1 ids: 100 r, 100 r + 1, ...
    batcher.lookup(torch::arange(100 * r, 100 * r + r + 1, torch::kLong),
                   [&answers, r](const torch::Tensor& answer, const std::string& error) {
                     EXPECT_TRUE(error.empty()) << error;
                     answers[r].set_value(answer.clone());
                   },
                   /*announced=*/true);
  }
  for (int r = 0; r < kRequests; ++r) {
    const torch::Tensor got = answers[r].get_future().get();
    EXPECT_TRUE(torch::equal(got, rows_of(torch::arange(100 * r, 100 * r + r + 1, torch::kLong), {}))) << r;
  }
  EXPECT_EQ(calls.load(), 1);  // merged into one call
  EXPECT_EQ(batch_sizes, std::vector<int64_t>{kRequests * (kRequests + 1) / 2});
  const std::string text = metrics.prometheus_text();
  EXPECT_NE(text.find("speedtorch_server_batch_size_count{model=\"lookup\"} " + std::to_string(calls.load())),
            std::string::npos) << text;
  EXPECT_NE(text.find("speedtorch_server_queue_wait_seconds_count{model=\"lookup\"} 16"), std::string::npos);
}

TEST(RequestBatcher, ScoresAndLookupsEachGetTheirOwnAnswers) {
  RequestBatcher::Options options;
  options.window = std::chrono::milliseconds(2);
  options.max_ids = 5;  // forces several batches
  RequestBatcher batcher(rows_of, scores_of, options);
  std::vector<std::thread> clients;
  std::atomic<int> wrong{0};
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 20; ++i) {
        std::promise<torch::Tensor> done;
        const torch::Tensor users = torch::tensor({c, i}, torch::kLong);
        const torch::Tensor items = torch::tensor({i, c + 1}, torch::kLong);
        if (i % 2) {
          batcher.score(users, items, [&](const torch::Tensor& a, const std::string&) { done.set_value(a.clone()); });
          if (!torch::equal(done.get_future().get(), scores_of(users, items))) ++wrong;
        } else {
          batcher.lookup(users, [&](const torch::Tensor& a, const std::string&) { done.set_value(a.clone()); });
          if (!torch::equal(done.get_future().get(), rows_of(users, {}))) ++wrong;
        }
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// A window of 10 s does not hold a request when nothing else is on its way; a withdrawn announcement stops the
// wait for it.
TEST(RequestBatcher, TheWindowClosesWhenNoRequestIsOnItsWay) {
  RequestBatcher::Options options;
  options.window = std::chrono::seconds(10);
  RequestBatcher batcher(rows_of, scores_of, options);
  const auto start = std::chrono::steady_clock::now();
  std::promise<void> first, second;
  batcher.lookup(torch::tensor({1}, torch::kLong), [&](const torch::Tensor&, const std::string&) { first.set_value(); });
  first.get_future().wait();
  batcher.announce();
  batcher.announce();
  batcher.lookup(torch::tensor({2}, torch::kLong), [&](const torch::Tensor&, const std::string&) { second.set_value(); },
                 /*announced=*/true);
  batcher.withdraw();  // the other announced request was refused
  second.get_future().wait();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(RequestBatcher, AFailingModelCallFailsItsBatchOnly) {
  RequestBatcher::Options options;
  options.window = std::chrono::microseconds(0);
  RequestBatcher batcher(
      [](const torch::Tensor& ids, const torch::Tensor& items) {
        TORCH_CHECK(ids.min().item<int64_t>() >= 0, "negative id");
        return rows_of(ids, items);
      },
      scores_of, options);
  std::promise<std::string> failed;
  batcher.lookup(torch::tensor({-1}, torch::kLong),
                 [&](const torch::Tensor& a, const std::string& error) { failed.set_value(a.defined() ? "" : error); });
  EXPECT_NE(failed.get_future().get().find("negative id"), std::string::npos);
  std::promise<torch::Tensor> ok;
  batcher.lookup(torch::tensor({3}, torch::kLong), [&](const torch::Tensor& a, const std::string&) { ok.set_value(a); });
  EXPECT_TRUE(torch::equal(ok.get_future().get(), rows_of(torch::tensor({3}, torch::kLong), {})));
}

TEST(RequestBatcher, TheDestructorAnswersEverythingQueued) {
  std::atomic<int> answered{0};
  {
    RequestBatcher::Options options;
    options.window = std::chrono::seconds(10);  // nothing would run before the destructor without it
    RequestBatcher batcher(rows_of, scores_of, options);
    batcher.announce();  // one more on its way: the ten wait for it
    for (int i = 0; i < 10; ++i) {
      batcher.lookup(torch::tensor({i}, torch::kLong), [&](const torch::Tensor& a, const std::string&) {
        if (a.defined()) ++answered;
      });
    }
  }
  EXPECT_EQ(answered.load(), 10);
}

}  // namespace
}  // namespace speedtorch::serving

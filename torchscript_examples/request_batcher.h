// RequestBatcher: dynamic batching of the recommender's lookups and scores (as Triton's dynamic batcher does for
// its models). Requests that arrive within `window` of the oldest waiting one are merged, up to `max_ids` ids, into
// one model call; the answer is split back, so each request gets exactly the rows (or scores) of its own ids: a
// lookup's rows are the table's rows bit for bit, a score is computed per (user, item) pair as alone.
//
// The window closes early when no request is on its way: the server announces each batchable request as it
// arrives (announce()), before reading it on a worker, and a batch waits only while announced requests are still
// being read. Waiting longer would delay answers without adding to the batch: clients that wait for their answer
// before sending again (every keep-alive client) send nothing more until the batch is answered. Under load,
// requests queue while a batch runs, so batches grow by themselves.
//
// `runners` threads take batches; each runs its batches on its own CUDA stream when the model is on a GPU (set by
// `init_thread`, run once in each runner), and a batch waits only for its own stream (the model's answers are on
// the host when the model call returns: model_runner.h), never for the device.
//
// Done callbacks run on a runner thread, after the model call, each exactly once (with an error message instead of
// an answer when the model call threw); keep them short (write the answer, hand it to the HTTP server).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace speedtorch::serving {

class RequestMetrics;

class RequestBatcher {
 public:
  struct Options {
    std::chrono::microseconds window{1000};  // 0: run what is queued at once, wait for nothing
    int64_t max_ids = 16384;                 // a request with more ids than this runs alone
    int runners = 2;
    std::function<void()> init_thread;  // run first in each runner thread (its CUDA stream)
  };
  // answer: the request's part of the model's answer (host float), or undefined with `error` set.
  using Done = std::function<void(const torch::Tensor& answer, const std::string& error)>;
  // The model: rows of users (items undefined), or scores of (users[i], items[i]); host float answers.
  using Model = std::function<torch::Tensor(const torch::Tensor& users, const torch::Tensor& items)>;

  // `metrics` (may be null) records each batch's size and each request's wait in the queue.
  RequestBatcher(Model lookup, Model score, Options options, RequestMetrics* metrics = nullptr);
  // Runs what is queued, then joins the runners.
  ~RequestBatcher();
  RequestBatcher(const RequestBatcher&) = delete;
  RequestBatcher& operator=(const RequestBatcher&) = delete;

  // A request for the batcher has arrived and is being read; exactly one lookup() or score() with
  // `announced` = true, or one withdraw() (it was refused), must follow.
  void announce();
  void withdraw();

  // ids / users / items: 1-D host int64.
  void lookup(torch::Tensor ids, Done done, bool announced = false);
  void score(torch::Tensor users, torch::Tensor items, Done done, bool announced = false);

 private:
  using Clock = std::chrono::steady_clock;
  enum Kind { kLookup = 0, kScore = 1 };
  struct Job {
    torch::Tensor users, items;
    Done done;
    Clock::time_point queued;
  };

  void submit(Kind kind, Job job, bool announced);
  void run_runner();
  void run_batch(Kind kind, std::vector<Job>& jobs);

  Model models_[2];
  Options options_;
  RequestMetrics* metrics_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queues_[2];
  int64_t queued_ids_[2] = {0, 0};
  int64_t arriving_ = 0;  // announced, not yet submitted
  bool stopping_ = false;
  std::vector<std::thread> runners_;
};

}  // namespace speedtorch::serving

// Dynamic batching of lookups and scores (see request_batcher.h).
#include "request_batcher.h"

#include <exception>

#include "request_metrics.h"

namespace speedtorch::serving {

RequestBatcher::RequestBatcher(Model lookup, Model score, Options options, RequestMetrics* metrics)
    : models_{std::move(lookup), std::move(score)}, options_(std::move(options)), metrics_(metrics) {
  TORCH_CHECK(options_.runners >= 1, "RequestBatcher: runners must be >= 1, got ", options_.runners);
  TORCH_CHECK(options_.max_ids >= 1, "RequestBatcher: max_ids must be >= 1, got ", options_.max_ids);
  TORCH_CHECK(options_.window.count() >= 0, "RequestBatcher: the window must not be negative");
  for (int i = 0; i < options_.runners; ++i) runners_.emplace_back([this] { run_runner(); });
}

RequestBatcher::~RequestBatcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : runners_) t.join();
}

void RequestBatcher::announce() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++arriving_;
}

void RequestBatcher::withdraw() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --arriving_;
  }
  wake_.notify_all();  // a runner waiting for it need not
}

void RequestBatcher::lookup(torch::Tensor ids, Done done, bool announced) {
  submit(kLookup, {std::move(ids), torch::Tensor(), std::move(done), Clock::now()}, announced);
}

void RequestBatcher::score(torch::Tensor users, torch::Tensor items, Done done, bool announced) {
  submit(kScore, {std::move(users), std::move(items), std::move(done), Clock::now()}, announced);
}

void RequestBatcher::submit(Kind kind, Job job, bool announced) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (announced) --arriving_;
    queued_ids_[kind] += job.users.numel();
    queues_[kind].push_back(std::move(job));
  }
  wake_.notify_all();  // an idle runner starts a window; one waiting on a window sees whether the batch is full
}

void RequestBatcher::run_runner() {
  if (options_.init_thread) options_.init_thread();
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !queues_[kLookup].empty() || !queues_[kScore].empty(); });
    if (queues_[kLookup].empty() && queues_[kScore].empty()) return;  // stopping, nothing left
    // The kind whose oldest request has waited longest goes first.
    const Kind kind = queues_[kScore].empty() || (!queues_[kLookup].empty() &&
                                                  queues_[kLookup].front().queued <= queues_[kScore].front().queued)
                          ? kLookup
                          : kScore;
    // More may come until the oldest request's window closes, the batch is full, or none is on its way.
    const Clock::time_point close = queues_[kind].front().queued + options_.window;
    while (!stopping_ && !queues_[kind].empty() && queued_ids_[kind] < options_.max_ids && arriving_ > 0 &&
           Clock::now() < close) {
      wake_.wait_until(lock, close);
    }
    if (queues_[kind].empty()) continue;  // another runner took them
    std::vector<Job> jobs;
    int64_t ids = 0;
    while (!queues_[kind].empty()) {
      const int64_t n = queues_[kind].front().users.numel();
      if (!jobs.empty() && ids + n > options_.max_ids) break;
      ids += n;
      jobs.push_back(std::move(queues_[kind].front()));
      queues_[kind].pop_front();
    }
    queued_ids_[kind] -= ids;
    lock.unlock();
    wake_.notify_all();  // what is left is another runner's
    run_batch(kind, jobs);
    lock.lock();
  }
}

void RequestBatcher::run_batch(Kind kind, std::vector<Job>& jobs) {
  const Clock::time_point start = Clock::now();
  if (metrics_ != nullptr) {
    std::vector<double> waits;
    waits.reserve(jobs.size());
    for (const Job& job : jobs) waits.push_back(std::chrono::duration<double>(start - job.queued).count());
    metrics_->observe_batch(kind == kLookup ? "lookup" : "score", waits);
  }
  torch::Tensor answer;
  std::string error;
  try {
    std::vector<torch::Tensor> users, items;
    for (const Job& job : jobs) {
      users.push_back(job.users);
      if (kind == kScore) items.push_back(job.items);
    }
    answer = models_[kind](jobs.size() == 1 ? users[0] : torch::cat(users),
                           kind == kLookup ? torch::Tensor() : jobs.size() == 1 ? items[0] : torch::cat(items));
  } catch (const std::exception& e) {
    error = e.what();
  }
  int64_t offset = 0;
  for (Job& job : jobs) {
    const int64_t n = job.users.numel();
    try {
      job.done(error.empty() ? answer.narrow(0, offset, n) : torch::Tensor(), error);
    } catch (...) {
      // A callback that throws loses only its own answer (its Responder answers 500).
    }
    offset += n;
  }
}

}  // namespace speedtorch::serving

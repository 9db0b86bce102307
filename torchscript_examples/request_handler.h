// The recommender service behind the C++ server: JSON requests in, JSON answers out, over a scripted model loaded
// with torch::jit::load (torchscript_examples/recommender_model.py). Kept apart from the HTTP layer so GoogleTest
// can drive it directly.
//
// Concurrency: any number of lookups, scores and top-k run at once (shared lock); a row update takes the lock
// exclusively, so a reader sees each row entirely before or entirely after an update, never a mix. The lock is the
// table's own kind (embedding/table_lock.h): a waiting update stops new reads at the door, so a stream of reads
// cannot hold an update back indefinitely (as a reader-preferring std::shared_mutex on glibc would).
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <string>

#include "embedding/table_lock.h"

namespace speedtorch::serving {

struct Response {
  int status = 200;
  std::string body;  // JSON
};

class RecommenderService {
 public:
  // max_batch: the most ids one request may name (larger requests get 413).
  // device: where the ids go (the model's dense parameters must be there; its PinnedEmbedding stays in pinned
  // host memory and is read by the device over UVA when it is a GPU).
  RecommenderService(torch::jit::Module model, int64_t max_batch, torch::Device device = torch::kCPU);

  // POST /lookup {"ids": [int, ...]}              -> {"rows": [[float, ...], ...]}
  Response lookup(const std::string& body) const;
  // POST /topk {"user": int, "k": int}            -> {"items": [int, ...], "scores": [float, ...]}
  Response top_k(const std::string& body) const;
  // POST /score {"users": [int], "items": [int]}  -> {"scores": [float, ...]}
  Response score(const std::string& body) const;
  // POST /update {"ids": [int], "rows": [[float]]} -> {"updated": n}
  Response update(const std::string& body);

  int64_t num_users() const { return num_users_; }

 private:
  mutable torch::jit::Module model_;  // its methods do not change the module's structure
  mutable TableLock rows_lock_;
  int64_t max_batch_;
  torch::Device device_;
  int64_t num_users_;
  int64_t num_items_;
  int64_t dim_;
};

}  // namespace speedtorch::serving

// The recommender service behind the C++ server: JSON requests in, JSON answers out, over a model run by a
// ModelRunner (model_runner.h: a scripted model of recommender_model.py, or an AOTInductor package of
// recommender_aoti.py with its table opened from files). Kept apart from the HTTP layer so GoogleTest can drive it
// directly.
//
// Concurrency: any number of lookups, scores and top-k run at once (shared lock); a row update takes the lock
// exclusively, so a reader sees each row entirely before or entirely after an update, never a mix. The lock is the
// table's own kind (embedding/table_lock.h): a waiting update stops new reads at the door, so a stream of reads
// cannot hold an update back indefinitely (as a reader-preferring std::shared_mutex on glibc would). A read holds the
// lock until its answer is on the host (ModelRunner's contract), so no GPU kernel still reads when an update writes.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embedding/table_lock.h"
#include "model_runner.h"

namespace speedtorch::serving {

struct Response {
  int status = 200;
  std::string body;  // JSON
};

class RecommenderService {
 public:
  // max_batch: the most ids one request may name (larger requests get 413).
  // A scripted model, run on `device` (make_torchscript_runner: the module is moved there; its PinnedEmbedding
  // stays in pinned host memory and is read by the device over UVA when it is a GPU).
  RecommenderService(torch::jit::Module model, int64_t max_batch, torch::Device device = torch::kCPU);
  // Any model form (model_runner.h: open_model chooses by file).
  RecommenderService(std::unique_ptr<ModelRunner> model, int64_t max_batch);

  // POST /lookup {"ids": [int, ...]}              -> {"rows": [[float, ...], ...]}
  Response lookup(const std::string& body) const;
  // POST /topk {"user": int, "k": int}            -> {"items": [int, ...], "scores": [float, ...]}
  Response top_k(const std::string& body) const;
  // POST /score {"users": [int], "items": [int]}  -> {"scores": [float, ...]}
  Response score(const std::string& body) const;
  // POST /update {"ids": [int], "rows": [[float]]} -> {"updated": n}; 409 when the table is a read-only serving copy
  // (quantized_recommender.py: updates go to the float32 table, which is converted again).
  Response update(const std::string& body);

  int64_t num_users() const { return num_users_; }
  int64_t num_items() const { return num_items_; }
  int64_t dim() const { return dim_; }
  int64_t max_batch() const { return max_batch_; }
  // The user table's row format (ModelRunner::table_format).
  const std::string& table_format() const { return table_format_; }

  // lookup() and score() in three steps, for the dynamic batcher (request_batcher.h), which runs the middle one
  // for many requests at once: read a request (false and `failure` set when it is refused), run the model on ids
  // (host int64, checked) under the shared lock, write the answer (a 500 when it holds infinity or NaN).
  bool read_lookup(const std::string& body, torch::Tensor& ids, Response& failure) const;
  bool read_score(const std::string& body, torch::Tensor& users, torch::Tensor& items, Response& failure) const;
  torch::Tensor rows(const torch::Tensor& ids) const;
  torch::Tensor scores(const torch::Tensor& users, const torch::Tensor& items) const;
  static Response rows_answer(const torch::Tensor& rows);
  static Response scores_answer(const torch::Tensor& scores);
  // Checks ids (of a v2 inference input, inference_protocol.h) against [0, limit): `field` names them in the message.
  static bool check_ids(const std::vector<int64_t>& ids, int64_t limit, const std::string& field, Response& failure);

 private:
  std::unique_ptr<ModelRunner> model_;
  mutable TableLock rows_lock_;
  int64_t max_batch_;
  int64_t num_users_;
  int64_t num_items_;
  int64_t dim_;
  std::string table_format_;
};

}  // namespace speedtorch::serving

// JSON request handling for the recommender server (see request_handler.h).
#include "request_handler.h"

#include "request_json.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <vector>

namespace speedtorch::serving {
namespace {

using nlohmann::json;

Response error(int status, const std::string& message) { return {status, json{{"error", message}}.dump()}; }

// Reads a non-empty list of ids in [0, limit) from field `name`; sets `failure` and returns empty otherwise.
std::vector<int64_t> ids_field(const json& request, const char* name, int64_t limit, int64_t max_batch,
                               Response& failure) {
  std::vector<int64_t> ids;
  if (!request.contains(name) || !request[name].is_array()) {
    failure = error(400, std::string("field '") + name + "' must be a list of integer ids");
    return {};
  }
  const json& list = request[name];
  if (list.empty()) {
    failure = error(400, std::string("field '") + name + "' is empty");
    return {};
  }
  if (static_cast<int64_t>(list.size()) > max_batch) {
    failure = error(413, std::string("field '") + name + "' names " + std::to_string(list.size()) +
                             " ids; at most " + std::to_string(max_batch) + " per request");
    return {};
  }
  ids.reserve(list.size());
  for (const json& v : list) {
    std::string message;
    const auto id = read_id(v, limit, name, failure.status, message);
    if (!id) {
      failure = error(failure.status, message);
      return {};
    }
    ids.push_back(*id);
  }
  failure.status = 200;
  return ids;
}

bool parse(const std::string& body, json& out, Response& failure) {
  std::string message;
  auto parsed = parse_json_object(body, message);
  if (!parsed) {
    failure = error(400, message);
    return false;
  }
  out = std::move(*parsed);
  return true;
}

// JSON has no infinity or NaN (nlohmann would write null): an answer holding one is refused, not garbled.
std::optional<Response> non_finite(const torch::Tensor& answer, const char* what) {
  const float* p = answer.data_ptr<float>();  // host float, contiguous (ModelRunner)
  if (std::all_of(p, p + answer.numel(), [](float v) { return std::isfinite(v); })) return std::nullopt;
  return error(500, std::string("the model's ") + what + " hold infinity or NaN, which JSON cannot carry");
}

torch::Tensor to_tensor(const std::vector<int64_t>& ids) {
  return torch::tensor(ids, torch::TensorOptions().dtype(torch::kLong));
}

// {"name":[v, ...]} or, for rows (n, d), {"name":[[...], ...]}: host float, contiguous, finite (ModelRunner's
// answers, checked by non_finite).
std::string floats_answer(const char* name, const torch::Tensor& values) {
  std::string out = std::string("{\"") + name + "\":[";
  const float* p = values.data_ptr<float>();
  if (values.dim() == 1) {
    append_json_floats(out, p, values.numel());
  } else {
    const int64_t width = values.size(1);
    for (int64_t i = 0; i < values.size(0); ++i) {
      out += i ? ",[" : "[";
      append_json_floats(out, p + i * width, width);
      out += ']';
    }
  }
  return out + "]}";
}

}  // namespace

RecommenderService::RecommenderService(torch::jit::Module model, int64_t max_batch, torch::Device device)
    : RecommenderService(make_torchscript_runner(std::move(model), device), max_batch) {}

RecommenderService::RecommenderService(std::unique_ptr<ModelRunner> model, int64_t max_batch)
    : model_(std::move(model)), max_batch_(max_batch) {
  TORCH_CHECK(model_ != nullptr, "RecommenderService: model must not be null");
  TORCH_CHECK(max_batch > 0, "max_batch must be > 0, got ", max_batch);
  num_users_ = model_->num_users();
  num_items_ = model_->num_items();
  dim_ = model_->dim();
  table_format_ = model_->table_format();
}

bool RecommenderService::read_lookup(const std::string& body, torch::Tensor& ids, Response& failure) const {
  json request;
  if (!parse(body, request, failure)) return false;
  const auto list = ids_field(request, "ids", num_users_, max_batch_, failure);
  if (failure.status != 200) return false;
  ids = to_tensor(list);
  return true;
}

torch::Tensor RecommenderService::rows(const torch::Tensor& ids) const {
  std::shared_lock<TableLock> lock(rows_lock_);  // held until the rows are on the host (ModelRunner)
  return model_->lookup(ids);
}

Response RecommenderService::rows_answer(const torch::Tensor& rows) {
  if (auto refused = non_finite(rows, "rows")) return *refused;
  return {200, floats_answer("rows", rows)};
}

Response RecommenderService::lookup(const std::string& body) const {
  torch::Tensor ids;
  Response failure;
  if (!read_lookup(body, ids, failure)) return failure;
  return rows_answer(rows(ids));
}

Response RecommenderService::top_k(const std::string& body) const {
  json request;
  Response failure;
  if (!parse(body, request, failure)) return failure;
  if (!request.contains("user") || !request["user"].is_number_integer()) return error(400, "'user' must be an id");
  const json& k_value = request.contains("k") ? request["k"] : json();
  // k as an unsigned above INT64_MAX is out of range, not negative.
  if (!k_value.is_number_integer() || (k_value.is_number_unsigned() && k_value.get<uint64_t>() > 1ull << 62)) {
    return error(400, "'k' must be an integer in [1, " + std::to_string(max_batch_) + "]");
  }
  int status = 200;
  std::string message;
  const auto user = read_id(request["user"], num_users_, "user", status, message);
  if (!user) return error(status, message);
  const int64_t k = k_value.get<int64_t>();
  if (k < 1 || k > max_batch_) return error(400, "'k' must be in [1, " + std::to_string(max_batch_) + "]");
  std::shared_lock<TableLock> lock(rows_lock_);
  const auto [items, scores] = model_->top_k(*user, k);
  lock.unlock();
  if (auto refused = non_finite(scores, "scores")) return *refused;
  return {200, json{{"items", std::vector<int64_t>(items.data_ptr<int64_t>(), items.data_ptr<int64_t>() + items.numel())},
                    {"scores", std::vector<float>(scores.data_ptr<float>(), scores.data_ptr<float>() + scores.numel())}}
                   .dump()};
}

bool RecommenderService::read_score(const std::string& body, torch::Tensor& users, torch::Tensor& items,
                                    Response& failure) const {
  json request;
  if (!parse(body, request, failure)) return false;
  const auto user_list = ids_field(request, "users", num_users_, max_batch_, failure);
  if (failure.status != 200) return false;
  const auto item_list = ids_field(request, "items", num_items_, max_batch_, failure);
  if (failure.status != 200) return false;
  if (user_list.size() != item_list.size()) {
    failure = error(400, "'users' and 'items' must have the same length");
    return false;
  }
  users = to_tensor(user_list);
  items = to_tensor(item_list);
  return true;
}

torch::Tensor RecommenderService::scores(const torch::Tensor& users, const torch::Tensor& items) const {
  std::shared_lock<TableLock> lock(rows_lock_);
  return model_->score(users, items);
}

Response RecommenderService::scores_answer(const torch::Tensor& scores) {
  if (auto refused = non_finite(scores, "scores")) return *refused;
  return {200, floats_answer("scores", scores)};
}

Response RecommenderService::score(const std::string& body) const {
  torch::Tensor users, items;
  Response failure;
  if (!read_score(body, users, items, failure)) return failure;
  return scores_answer(scores(users, items));
}

bool RecommenderService::check_ids(const std::vector<int64_t>& ids, int64_t limit, const std::string& field,
                                   Response& failure) {
  for (const int64_t id : ids) {
    if (id < 0 || id >= limit) {
      failure = error(404, "unknown id " + std::to_string(id) + " in '" + field + "': ids are in [0, " +
                               std::to_string(limit) + ")");
      return false;
    }
  }
  return true;
}

Response RecommenderService::update(const std::string& body) {
  if (!model_->updatable()) {
    return error(409, "the user table is a read-only " + model_->table_format() + " serving copy: update the "
                      "float32 model's table and convert it again (torchscript_examples/quantized_recommender.py)");
  }
  json request;
  Response failure;
  if (!parse(body, request, failure)) return failure;
  const auto ids = ids_field(request, "ids", num_users_, max_batch_, failure);
  if (failure.status != 200) return failure;
  if (!request.contains("rows") || !request["rows"].is_array() || request["rows"].size() != ids.size()) {
    return error(400, "'rows' must be a list with one row per id");
  }
  std::vector<float> values;
  values.reserve(ids.size() * dim_);
  for (const json& row : request["rows"]) {
    if (!row.is_array() || static_cast<int64_t>(row.size()) != dim_) {
      return error(400, "every row must be a list of " + std::to_string(dim_) + " numbers");
    }
    for (const json& v : row) {
      std::string message;
      const auto value = read_float(v, message);
      if (!value) return error(400, message);
      values.push_back(*value);
    }
  }
  const torch::Tensor rows =
      torch::from_blob(values.data(), {static_cast<int64_t>(ids.size()), dim_}, torch::kFloat).clone();
  std::unique_lock<TableLock> lock(rows_lock_);
  model_->update_rows(to_tensor(ids), rows);
  return {200, json{{"updated", ids.size()}}.dump()};
}

}  // namespace speedtorch::serving

// The recommender server's routes (see recommender_routes.h).
#include "recommender_routes.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "inference_protocol.h"

namespace speedtorch::serving {
namespace {

using nlohmann::json;

const char* const kModels[] = {"lookup", "score"};

HttpResponse http(const Response& r) { return {r.status, "application/json", {}, r.body}; }

// Responders cross into std::function (copyable) wrapped in a shared_ptr; whoever answers first answers.
using SharedResponder = std::shared_ptr<Responder>;

// Runs `work` on a worker; an exception becomes a 500 with the message in the server log, not in the answer.
void on_worker(WorkerPool& workers, SharedResponder responder, std::function<HttpResponse()> work) {
  workers.run([responder = std::move(responder), work = std::move(work)] {
    HttpResponse answer;
    try {
      answer = work();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "speedtorch_server: %s\n", e.what());
      answer = error_answer(500, "internal error (details in the server log)");
    }
    responder->respond(std::move(answer));
  });
}

// The batcher's answer to a request: formatted by `format`, or a 500 when the model call threw.
RequestBatcher::Done answer_with(SharedResponder responder,
                                 std::function<HttpResponse(const torch::Tensor&)> format) {
  return [responder = std::move(responder), format = std::move(format)](const torch::Tensor& answer,
                                                                        const std::string& failure) {
    if (!failure.empty()) {
      std::fprintf(stderr, "speedtorch_server: %s\n", failure.c_str());
      responder->respond(error_answer(500, "internal error (details in the server log)"));
      return;
    }
    responder->respond(format(answer));
  };
}

// A request announced to the batcher (RequestBatcher::announce) and not yet submitted: withdrawn if it never is.
class Announced {
 public:
  explicit Announced(RequestBatcher& batcher) : batcher_(batcher) { batcher_.announce(); }
  ~Announced() {
    if (pending_) batcher_.withdraw();
  }
  Announced(const Announced&) = delete;
  Announced& operator=(const Announced&) = delete;
  bool take() { return std::exchange(pending_, false); }  // true: the submit carries the announcement

 private:
  RequestBatcher& batcher_;
  bool pending_ = true;
};

// /v2/models/NAME[/versions/1][SUFFIX] -> NAME and SUFFIX ("", "/ready" or "/infer"); nothing for other paths.
bool split_model_path(const std::string& path, std::string& name, std::string& suffix) {
  static const std::string prefix = "/v2/models/";
  if (path.compare(0, prefix.size(), prefix) != 0) return false;
  std::string rest = path.substr(prefix.size());
  const std::size_t slash = rest.find('/');
  name = rest.substr(0, slash);
  rest = slash == std::string::npos ? "" : rest.substr(slash);
  if (rest.compare(0, 10, "/versions/") == 0) {
    const std::size_t end = rest.find('/', 10);
    if (rest.substr(10, end == std::string::npos ? std::string::npos : end - 10) != "1") return false;
    rest = end == std::string::npos ? "" : rest.substr(end);
  }
  suffix = rest;
  return !name.empty() && (suffix.empty() || suffix == "/ready" || suffix == "/infer");
}

bool known_model(const std::string& name) {
  for (const char* m : kModels) {
    if (name == m) return true;
  }
  return false;
}

json tensor_metadata(const char* name, const char* datatype, std::vector<int64_t> shape) {
  return {{"name", name}, {"datatype", datatype}, {"shape", std::move(shape)}};
}

}  // namespace

RecommenderRoutes::RecommenderRoutes(RecommenderService& service, RequestBatcher& batcher, WorkerPool& workers,
                                     RequestMetrics& metrics)
    : service_(service), batcher_(batcher), workers_(workers), metrics_(metrics) {}

std::vector<std::string> RecommenderRoutes::endpoints() {
  std::vector<std::string> out = {"/health", "/lookup", "/topk", "/score", "/update", "/metrics",
                                  "/v2", "/v2/health/live", "/v2/health/ready"};
  for (const char* m : kModels) {
    for (const std::string version : {"", "/versions/1"}) {
      for (const char* suffix : {"", "/ready", "/infer"}) out.push_back(std::string("/v2/models/") + m + version + suffix);
    }
  }
  return out;
}

void RecommenderRoutes::operator()(HttpRequest&& request, Responder responder) {
  const std::string path = request.path;
  const std::string& method = request.method;
  // The method a known path takes, checked once: anything else is a 405.
  const auto allow = [&](const char* expected) {
    if (method == expected) return true;
    HttpResponse refused = error_answer(405, path + " takes " + expected + " only");
    refused.headers.emplace_back("Allow", expected);
    responder.respond(std::move(refused));
    return false;
  };
  auto shared = [&responder] { return std::make_shared<Responder>(std::move(responder)); };

  if (path == "/health") {
    if (allow("GET")) {
      responder.respond({200, "application/json", {},
                         json{{"status", "ok"}, {"users", service_.num_users()}, {"table", service_.table_format()}}
                             .dump()});
    }
  } else if (path == "/v2/health/live" || path == "/v2/health/ready") {
    if (allow("GET")) responder.respond({200, "application/json", {}, ""});
  } else if (path == "/v2") {
    if (allow("GET")) {
      responder.respond({200, "application/json", {},
                         json{{"name", "speedtorch_server"}, {"version", "1"},
                              {"extensions", {"binary_tensor_data"}}}.dump()});
    }
  } else if (std::string name, suffix; split_model_path(path, name, suffix)) {
    if (!known_model(name)) {
      responder.respond(error_answer(404, "unknown model '" + name + "': this server has models 'lookup' and 'score'"));
    } else if (suffix == "/infer") {
      if (allow("POST")) infer(name, std::move(request), std::move(responder));
    } else if (suffix == "/ready") {
      if (allow("GET")) responder.respond({200, "application/json", {}, ""});
    } else if (allow("GET")) {
      const bool lookup = name == "lookup";
      json inputs = lookup ? json::array({tensor_metadata("ids", "INT64", {-1})})
                           : json::array({tensor_metadata("users", "INT64", {-1}),
                                          tensor_metadata("items", "INT64", {-1})});
      json outputs = json::array({lookup ? tensor_metadata("rows", "FP32", {-1, service_.dim()})
                                         : tensor_metadata("scores", "FP32", {-1})});
      responder.respond({200, "application/json", {},
                         json{{"name", name}, {"versions", {"1"}}, {"platform", "speedtorch"},
                              {"inputs", std::move(inputs)}, {"outputs", std::move(outputs)}}.dump()});
    }
  } else if (path == "/lookup" || path == "/score") {
    if (!allow("POST")) return;
    const bool lookup = path == "/lookup";
    auto body = std::make_shared<std::string>(std::move(request.body));
    auto announced = std::make_shared<Announced>(batcher_);
    workers_.run([this, lookup, body, announced, responder = shared()] {
      try {
        Response failure;
        torch::Tensor users, items;
        if (lookup ? !service_.read_lookup(*body, users, failure) : !service_.read_score(*body, users, items, failure)) {
          responder->respond(http(failure));
        } else if (lookup) {
          batcher_.lookup(users, answer_with(responder, [](const torch::Tensor& rows) {
                            return http(RecommenderService::rows_answer(rows));
                          }), announced->take());
        } else {
          batcher_.score(users, items, answer_with(responder, [](const torch::Tensor& scores) {
                           return http(RecommenderService::scores_answer(scores));
                         }), announced->take());
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "speedtorch_server: %s\n", e.what());
        responder->respond(error_answer(500, "internal error (details in the server log)"));
      }
    });
  } else if (path == "/topk" || path == "/update") {
    if (!allow("POST")) return;
    auto body = std::make_shared<std::string>(std::move(request.body));
    const bool top_k = path == "/topk";
    on_worker(workers_, shared(), [this, body, top_k] {
      return http(top_k ? service_.top_k(*body) : service_.update(*body));
    });
  } else if (path == "/metrics") {
    if (!allow("GET")) return;
    on_worker(workers_, shared(), [this] {
      return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", {}, metrics_.prometheus_text()};
    });
  } else {
    responder.respond(error_answer(404, "no such path: the server answers /lookup, /topk, /score, /update, /health, "
                                 "/metrics and the Open Inference Protocol under /v2"));
  }
}

void RecommenderRoutes::infer(const std::string& model, HttpRequest&& request, Responder responder) {
  auto held = std::make_shared<HttpRequest>(std::move(request));
  auto answer_to = std::make_shared<Responder>(std::move(responder));
  auto announced = std::make_shared<Announced>(batcher_);
  workers_.run([this, model, held, answer_to, announced] {
    try {
      const HttpRequest& request = *held;
      if (const std::string* coding = request.header("content-encoding"); coding && *coding != "identity") {
        answer_to->respond(error_answer(415, "compressed request bodies are not served"));
        return;
      }
      std::optional<std::size_t> header_length;
      std::string message;
      if (!read_inference_header_length(request.header("inference-header-content-length"), request.body.size(),
                                        header_length, message)) {
        answer_to->respond(error_answer(400, message));
        return;
      }
      int status = 400;
      auto parsed = parse_infer_request(request.body, header_length, service_.max_batch(), message, &status);
      if (!parsed) {
        answer_to->respond(error_answer(status, message));
        return;
      }
      auto infer = std::make_shared<InferRequest>(std::move(*parsed));
      const bool lookup = model == "lookup";
      const std::vector<std::string> expected = lookup ? std::vector<std::string>{"ids"}
                                                       : std::vector<std::string>{"users", "items"};
      const InferInput* inputs[2] = {nullptr, nullptr};
      for (const InferInput& input : infer->inputs) {
        for (std::size_t i = 0; i < expected.size(); ++i) {
          if (input.name == expected[i] && inputs[i] == nullptr) inputs[i] = &input;
        }
      }
      const std::string output = lookup ? "rows" : "scores";
      if (infer->inputs.size() != expected.size() || inputs[0] == nullptr ||
          (!lookup && (inputs[1] == nullptr || inputs[0]->shape != inputs[1]->shape))) {
        answer_to->respond(error_answer(400, lookup ? "model 'lookup' takes one input, 'ids'"
                                                   : "model 'score' takes two inputs of one shape, 'users' and "
                                                     "'items'"));
        return;
      }
      if (!infer->requested_output.empty() && infer->requested_output != output) {
        answer_to->respond(error_answer(400, "model '" + model + "' has one output, '" + output + "'"));
        return;
      }
      if (inputs[0]->values.empty()) {
        answer_to->respond(error_answer(400, "input '" + expected[0] + "' is empty"));
        return;
      }
      Response failure;
      if (!RecommenderService::check_ids(inputs[0]->values, service_.num_users(), expected[0], failure) ||
          (!lookup && !RecommenderService::check_ids(inputs[1]->values, service_.num_items(), "items", failure))) {
        answer_to->respond(http(failure));
        return;
      }
      const auto ids = [](const InferInput& input) {
        return torch::tensor(input.values, torch::TensorOptions().dtype(torch::kLong));
      };
      std::vector<int64_t> shape = inputs[0]->shape;
      if (lookup) shape.push_back(service_.dim());
      auto format = [model, infer, output, shape](const torch::Tensor& answer) {
        return infer_answer(model, *infer, output, shape, answer.data_ptr<float>());
      };
      if (lookup) batcher_.lookup(ids(*inputs[0]), answer_with(answer_to, format), announced->take());
      else batcher_.score(ids(*inputs[0]), ids(*inputs[1]), answer_with(answer_to, format), announced->take());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "speedtorch_server: %s\n", e.what());
      answer_to->respond(error_answer(500, "internal error (details in the server log)"));
    }
  });
}

}  // namespace speedtorch::serving

// The recommender server's routes: what each path and method does, and on which thread (http_server.h's handler).
//
//   GET  /health, /v2/health/live, /v2/health/ready          answered on the event loop (cheap: liveness)
//   GET  /v2, /v2/models/{lookup,score}[/versions/1][/ready]  the protocol's metadata, on the event loop
//   POST /lookup, /score                                      read on a worker, run by the dynamic batcher
//   POST /v2/models/{lookup,score}[/versions/1]/infer         read on a worker (inference_protocol.h), batched
//   POST /topk, /update; GET /metrics                         on a worker
// Another path is a 404; a known path with another method a 405 naming the allowed one.
#pragma once

#include <string>
#include <vector>

#include "http_server.h"
#include "request_batcher.h"
#include "request_handler.h"
#include "request_metrics.h"
#include "worker_pool.h"

namespace speedtorch::serving {

class RecommenderRoutes {
 public:
  // All must outlive the routes (and the HttpServer that calls them).
  RecommenderRoutes(RecommenderService& service, RequestBatcher& batcher, WorkerPool& workers,
                    RequestMetrics& metrics);

  // The HttpServer handler: runs on the event loop, never blocks.
  void operator()(HttpRequest&& request, Responder responder);

  // Every path the routes answer (RequestMetrics counts any other as "other").
  static std::vector<std::string> endpoints();

 private:
  void infer(const std::string& model, HttpRequest&& request, Responder responder);

  RecommenderService& service_;
  RequestBatcher& batcher_;
  WorkerPool& workers_;
  RequestMetrics& metrics_;
};

}  // namespace speedtorch::serving

// MEASUREMENT PROTOTYPE (issue 34 item 2): speedtorch_server_beast, the example server's routes, batcher, model
// runner and metrics (the same objects server_main.cpp builds) behind the Boost.Beast front end of
// beast_http_server.h instead of our epoll HttpServer. Takes the options load_test.py passes (and the batching
// ones); CPU only; start-up errors are not polished. Not the server: see bench/RESULTS.md (2026-11-29).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>

#include "beast_http_server.h"
#include "model_runner.h"
#include "recommender_routes.h"
#include "request_batcher.h"
#include "request_handler.h"
#include "request_metrics.h"
#include "stop_signal_watcher.h"
#include "worker_pool.h"

using namespace speedtorch::serving;

int main(int argc, char** argv) {
  block_stop_signals();
  if (argc < 2 || argv[1][0] == '-') {
    std::fputs("usage: speedtorch_server_beast MODEL.pt [--port 0] [--threads 8] [--max-batch 4096] "
               "[--device cpu] [--table T] [--batch-window-us 1000] [--batch-max-ids N] [--batch-runners 2] "
               "[--max-body-bytes N] [--idle-timeout S] [--write-timeout S]\n", stderr);
    return 2;
  }
  HttpServerOptions http;
  int threads = 8;
  long long max_batch = 4096;
  std::string table;
  RequestBatcher::Options batching;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--host") http.host = value;
    else if (flag == "--port") http.port = std::stoi(value);
    else if (flag == "--threads") threads = std::stoi(value);
    else if (flag == "--max-batch") max_batch = std::stoll(value);
    else if (flag == "--device" && value == "cpu") continue;
    else if (flag == "--table") table = value;
    else if (flag == "--batch-window-us") batching.window = std::chrono::microseconds(std::stoll(value));
    else if (flag == "--batch-max-ids") batching.max_ids = std::stoll(value);
    else if (flag == "--batch-runners") batching.runners = std::stoi(value);
    else if (flag == "--max-body-bytes") http.limits.max_body_bytes = std::stoull(value);
    else if (flag == "--idle-timeout") http.idle_timeout_s = std::stod(value);
    else if (flag == "--write-timeout") http.write_timeout_s = std::stod(value);
    // Taken so that the server tests can start it, but not enforced (beast_http_server.h says what is missing).
    else if (flag == "--header-timeout" || flag == "--body-timeout" || flag == "--max-connections") continue;
    else {
      std::fprintf(stderr, "speedtorch_server_beast: unsupported option %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  try {
    RecommenderService service(open_model(argv[1], table, torch::kCPU, static_cast<size_t>(threads + batching.runners)),
                               max_batch);
    RequestMetrics metrics(RecommenderRoutes::endpoints());
    WorkerPool workers(threads, nullptr);
    RequestBatcher batcher([&](const torch::Tensor& ids, const torch::Tensor&) { return service.rows(ids); },
                           [&](const torch::Tensor& users, const torch::Tensor& items) {
                             return service.scores(users, items);
                           },
                           batching, &metrics);
    RecommenderRoutes routes(service, batcher, workers, metrics);
    prototype::BeastHttpServer server(http, std::ref(routes),
                                      [&metrics](const std::string& method, const std::string& path, int status,
                                                 double seconds) { metrics.observe(method, path, status, seconds); });
    const StopSignalWatcher watcher([&server](int) { server.stop(); });
    std::printf("listening on %s:%d\n", http.host.c_str(), server.port());
    std::fflush(stdout);
    server.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speedtorch_server_beast: %s\n", e.what());
    return 1;
  }
  return 0;
}

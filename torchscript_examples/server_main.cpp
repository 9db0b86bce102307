// speedtorch_server: serves a recommender over HTTP on localhost with no Python: a scripted model
// (recommender_model.py) or an AOTInductor package (recommender_aoti.py) with its user table's files (model_runner.h).
// POST /lookup, /topk, /score, /update with JSON bodies (request_handler.h), GET /health, and GET /metrics in the
// Prometheus text format (metrics_endpoint.h: request counts, latencies, library counters). Many requests run at
// once on a thread pool; a bad request gets a 4xx with a message and never takes the server down.
//
//   speedtorch_server MODEL.pt [--host 127.0.0.1] [--port 0] [--threads 8] [--max-batch 4096] [--device cpu]
//   speedtorch_server MODEL.pt2 --table USERS.npy [the same options]
// --device cuda runs the model on the GPU (a package must be compiled for cuda); the user table stays in pinned host
// memory and the GPU reads the rows a request names over UVA. A package's table is opened copy-on-write: updates
// live in the server's memory, the files never change.
// With --port 0 the kernel picks a free port; the first line printed is "listening on HOST:PORT".
// SIGTERM / SIGINT stop it: it takes no new connection, finishes the requests it has, and exits with status 0
// (stop_signal_watcher.h).
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <thread>

#include "metrics_endpoint.h"
#include "model_runner.h"
#include "request_handler.h"
#include "stop_signal_watcher.h"

namespace {

// Runs a handler; whatever it throws becomes a 500 with the message, not a dead server.
void respond(httplib::Response& res, const std::function<speedtorch::serving::Response()>& handler) {
  speedtorch::serving::Response out;
  try {
    out = handler();
  } catch (const std::exception& e) {
    out = {500, "{\"error\": \"internal error (details in the server log)\"}"};
    std::fprintf(stderr, "speedtorch_server: %s\n", e.what());
  }
  res.status = out.status;
  res.set_content(out.body, "application/json");
}

}  // namespace

int main(int argc, char** argv) {
  speedtorch::serving::block_stop_signals();  // before any thread starts (see stop_signal_watcher.h)
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.pt|MODEL.pt2 [--table USERS.npy] [--host H] [--port P] [--threads T] "
                 "[--max-batch N] [--device D]\n", argv[0]);
    return 2;
  }
  std::string host = "127.0.0.1";
  int port = 0;
  int threads = 8;
  long max_batch = 4096;
  std::string device = "cpu";
  std::string table;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--host") host = argv[i + 1];
    else if (flag == "--port") port = std::atoi(argv[i + 1]);
    else if (flag == "--threads") threads = std::atoi(argv[i + 1]);
    else if (flag == "--max-batch") max_batch = std::atol(argv[i + 1]);
    else if (flag == "--device") device = argv[i + 1];
    else if (flag == "--table") table = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (threads < 1 || max_batch < 1) {
    std::fprintf(stderr, "speedtorch_server: --threads and --max-batch must be >= 1, got %d and %ld\n", threads,
                 max_batch);
    return 2;
  }
  try {
    // A bad device name, model or table throws: reported below, exit 1.
    speedtorch::serving::RecommenderService service(
        speedtorch::serving::open_model(argv[1], table, torch::Device(device), static_cast<size_t>(threads)),
        max_batch);
    // Before the server: it must outlive the server's threads, which record into it.
    speedtorch::serving::RequestMetrics metrics({"/health", "/lookup", "/topk", "/score", "/update", "/metrics"});
    httplib::Server server;
    server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    server.set_payload_max_length(64 << 20);
    speedtorch::serving::serve_metrics(server, metrics);
    server.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\": \"ok\", \"users\": " + std::to_string(service.num_users()) + "}",
                      "application/json");
    });
    server.Post("/lookup", [&](const httplib::Request& req, httplib::Response& res) {
      respond(res, [&] { return service.lookup(req.body); });
    });
    server.Post("/topk", [&](const httplib::Request& req, httplib::Response& res) {
      respond(res, [&] { return service.top_k(req.body); });
    });
    server.Post("/score", [&](const httplib::Request& req, httplib::Response& res) {
      respond(res, [&] { return service.score(req.body); });
    });
    server.Post("/update", [&](const httplib::Request& req, httplib::Response& res) {
      respond(res, [&] { return service.update(req.body); });
    });
    if (port == 0) port = server.bind_to_any_port(host);
    else if (!server.bind_to_port(host, port)) {
      std::fprintf(stderr, "speedtorch_server: cannot bind %s:%d\n", host.c_str(), port);
      return 1;
    }
    std::atomic<bool> listen_returned{false};
    const speedtorch::serving::StopSignalWatcher watcher([&](int signal) {
      std::fprintf(stderr, "speedtorch_server: stopping on signal %d\n", signal);
      // stop() is a no-op until listen_after_bind has started serving: a signal that comes right after the
      // "listening on" line must not be lost.
      while (!server.is_running() && !listen_returned.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      server.stop();
    });
    std::printf("listening on %s:%d\n", host.c_str(), port);
    std::fflush(stdout);
    server.listen_after_bind();
    listen_returned.store(true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "speedtorch_server: %s\n", e.what());
    return 1;
  }
  return 0;
}

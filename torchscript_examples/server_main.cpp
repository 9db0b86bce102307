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
#include <cctype>
#include <cerrno>
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

// `text` as a whole decimal integer in [min, max], or a message naming the flag and exit 2 (atoi would take "4x"
// as 4 and "abc" as 0).
long long parse_integer(const std::string& flag, const std::string& text, long long min, long long max) {
  errno = 0;
  char* end = nullptr;
  const long long value = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])) || *end != '\0' || errno == ERANGE ||
      value < min || value > max) {
    std::fprintf(stderr, "speedtorch_server: %s takes an integer in [%lld, %lld], got '%s'\n", flag.c_str(), min, max,
                 text.c_str());
    std::exit(2);
  }
  return value;
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
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "speedtorch_server: option %s needs a value\n", flag.c_str());
      return 2;
    }
    const std::string value = argv[i + 1];
    if (flag == "--host") host = value;
    else if (flag == "--port") port = static_cast<int>(parse_integer(flag, value, 0, 65535));
    else if (flag == "--threads") threads = static_cast<int>(parse_integer(flag, value, 1, 4096));
    else if (flag == "--max-batch") max_batch = static_cast<long>(parse_integer(flag, value, 1, 1 << 24));
    else if (flag == "--device") device = value;
    else if (flag == "--table") table = value;
    else {
      std::fprintf(stderr, "speedtorch_server: unknown option %s\n", flag.c_str());
      return 2;
    }
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
    const int asked_port = port;
    if (port == 0) port = server.bind_to_any_port(host);  // -1 when it fails
    else if (!server.bind_to_port(host, port)) port = -1;
    if (port < 0) {
      std::fprintf(stderr, "speedtorch_server: cannot listen on %s port %d\n", host.c_str(), asked_port);
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

// speedtorch_server: serves a recommender over HTTP with no Python: a scripted model (recommender_model.py) or an
// AOTInductor package (recommender_aoti.py) with its user table's files (model_runner.h). Its own JSON endpoints
// (POST /lookup, /topk, /score, /update: request_handler.h), the Open Inference Protocol with Triton's binary
// tensors (/v2: inference_protocol.h), GET /health and GET /metrics (request_metrics.h); recommender_routes.h says
// which runs where. Lookups and scores that arrive together are merged into one model call (request_batcher.h).
// The HTTP layer (http_server.h) is one epoll loop that slow clients cannot stall; a bad request gets a 4xx with a
// message and never takes the server down.
// Usage, with the defaults: kUsage below.
// --device cuda runs the model on the GPU (a package must be compiled for cuda); the user table stays in pinned host
// memory and the GPU reads the rows a request names over UVA; each worker and batch runner has its own CUDA stream.
// A package's table is opened copy-on-write: updates live in the server's memory, the files never change.
// With --port 0 the kernel picks a free port; the first line printed is "listening on HOST:PORT".
// SIGTERM / SIGINT stop it: it takes no new connection, answers every request it has received whole, and exits
// with status 0 (stop_signal_watcher.h). --help prints the usage and exits 0; a bad option exits 2, and a model,
// table or device it cannot use exits 1, each with one line saying what is wrong.
#include <c10/core/impl/VirtualGuardImpl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <string>

#include "command_line_numbers.h"
#include "http_server.h"
#include "model_runner.h"
#include "recommender_routes.h"
#include "request_batcher.h"
#include "request_handler.h"
#include "request_metrics.h"
#include "stop_signal_watcher.h"
#include "worker_pool.h"

namespace {

using namespace speedtorch::serving;

const char kUsage[] =
    "usage: speedtorch_server MODEL.pt [--host 127.0.0.1] [--port 0] [--threads 8] [--max-batch 4096] [--device cpu]\n"
    "           [--batch-window-us 1000] [--batch-max-ids 16384] [--batch-runners 2] [--max-connections 1024]\n"
    "           [--max-body-bytes 67108864] [--idle-timeout 60] [--header-timeout 10] [--body-timeout 60]\n"
    "           [--write-timeout 60]            (--device: cpu, cuda or cuda:N)\n"
    "       speedtorch_server MODEL.pt2 --table USERS.npy [the same options]\n";

[[noreturn]] void startup_error(std::string message) {
  const std::string prefix = "speedtorch_server: ";  // the model runners' messages carry it already
  if (message.rfind(prefix, 0) == 0) message.erase(0, prefix.size());
  std::fprintf(stderr, "%s%s\n", prefix.c_str(), message.c_str());
  std::exit(1);
}

// The device --device names (cpu, or cuda[:N]), or exit 2 saying so. Whether that GPU is here is the model
// runner's check (check_device_present), after a package's own device is checked.
torch::Device checked_device(const std::string& name) {
  const auto index = name.rfind("cuda:", 0) == 0 ? speedtorch::examples::whole_integer(name.substr(5), 0, 1023)
                                                  : std::nullopt;
  if (name != "cpu" && name != "cuda" && !index) {
    std::fprintf(stderr, "speedtorch_server: --device takes cpu or cuda[:N], got '%s'\n", name.c_str());
    std::exit(2);
  }
  return torch::Device(name);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "speedtorch_server: %s\n", message.c_str());
  std::exit(2);
}

// `text` as a whole decimal integer in [min, max] (command_line_numbers.h), or exit 2 saying why.
long long parse_integer(const std::string& flag, const std::string& text, long long min, long long max) {
  const auto value = speedtorch::examples::whole_integer(text, min, max);
  if (!value) {
    usage_error(flag + " takes an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got '" +
                text + "'");
  }
  return *value;
}

// `text` as a whole decimal number of seconds in (0, max], or exit 2.
double parse_seconds(const std::string& flag, const std::string& text, double max) {
  const auto value = speedtorch::examples::whole_number(text, 0, max);
  if (!value || *value == 0) {
    usage_error(flag + " takes a number of seconds in (0, " + std::to_string(static_cast<int>(max)) + "], got '" +
                text + "'");
  }
  return *value;
}

// Gives the calling thread a CUDA stream of its own on `device` (nothing for a CPU device): work it queues waits for
// no other thread's, and its answers (copied to the host on that stream) wait for nothing else either.
std::function<void()> own_stream(torch::Device device) {
  if (!device.is_cuda()) return nullptr;
  return [device] {
    const c10::impl::VirtualGuardImpl impl(device.type());
    const c10::Device d = device.has_index() ? device : impl.getDevice();
    impl.setDevice(d);
    impl.exchangeStream(impl.getStreamFromGlobalPool(d, /*isHighPriority=*/false));
  };
}

}  // namespace

int main(int argc, char** argv) {
  block_stop_signals();  // before any thread starts (see stop_signal_watcher.h)
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (argc < 2 || argv[1][0] == '-') {
    std::fputs(kUsage, stderr);
    return 2;
  }
  HttpServerOptions http;
  int threads = 8;
  long long max_batch = 4096;
  std::string device = "cpu";
  std::string table;
  RequestBatcher::Options batching;
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage_error("option " + flag + " needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--host") http.host = value;
    else if (flag == "--port") http.port = static_cast<int>(parse_integer(flag, value, 0, 65535));
    else if (flag == "--threads") threads = static_cast<int>(parse_integer(flag, value, 1, 1024));
    else if (flag == "--max-batch") max_batch = parse_integer(flag, value, 1, 1 << 24);
    else if (flag == "--device") device = value;
    else if (flag == "--table") table = value;
    else if (flag == "--batch-window-us") batching.window = std::chrono::microseconds(parse_integer(flag, value, 0, 1000000));
    else if (flag == "--batch-max-ids") batching.max_ids = parse_integer(flag, value, 1, 1 << 26);
    else if (flag == "--batch-runners") batching.runners = static_cast<int>(parse_integer(flag, value, 1, 64));
    else if (flag == "--max-connections") http.max_connections = static_cast<int>(parse_integer(flag, value, 1, 1 << 20));
    else if (flag == "--max-body-bytes") http.limits.max_body_bytes = parse_integer(flag, value, 1, 1ll << 32);
    else if (flag == "--idle-timeout") http.idle_timeout_s = parse_seconds(flag, value, 86400);
    else if (flag == "--header-timeout") http.header_timeout_s = parse_seconds(flag, value, 3600);
    else if (flag == "--body-timeout") http.body_timeout_s = parse_seconds(flag, value, 3600);
    else if (flag == "--write-timeout") http.write_timeout_s = parse_seconds(flag, value, 3600);
    else usage_error("unknown option " + flag);
  }
  const torch::Device on = checked_device(device);
  for (const std::string& file : {std::string(argv[1]), table}) {
    if (!file.empty() && access(file.c_str(), R_OK) != 0) {
      startup_error("cannot read " + file + ": " + std::strerror(errno));
    }
  }
  try {
    // A model or table that does not load throws: reported below, exit 1.
    // Workers (top-k) and batch runners may run the model at once: an AOTInductor package gets that many instances.
    RecommenderService service(open_model(argv[1], table, on, static_cast<size_t>(threads + batching.runners)),
                               max_batch);
    RequestMetrics metrics(RecommenderRoutes::endpoints());
    WorkerPool workers(threads, own_stream(on));
    batching.init_thread = own_stream(on);
    RequestBatcher batcher([&](const torch::Tensor& ids, const torch::Tensor&) { return service.rows(ids); },
                           [&](const torch::Tensor& users, const torch::Tensor& items) {
                             return service.scores(users, items);
                           },
                           batching, &metrics);
    RecommenderRoutes routes(service, batcher, workers, metrics);
    HttpServer server(http, std::ref(routes),
                      [&metrics](const std::string& method, const std::string& path, int status, double seconds) {
                        metrics.observe(method, path, status, seconds);
                      });
    const StopSignalWatcher watcher([&server](int signal) {
      std::fprintf(stderr, "speedtorch_server: stopping on signal %d\n", signal);
      server.stop();  // safe before run() starts: the loop sees it first thing
    });
    std::printf("listening on %s:%d\n", http.host.c_str(), server.port());
    std::fflush(stdout);
    server.run();  // returns once every request received is answered; then the batcher and workers drain
  } catch (const c10::Error& e) {
    startup_error(e.what_without_backtrace());  // torch's own backtrace says nothing a user can act on
  } catch (const std::exception& e) {
    startup_error(e.what());
  }
  return 0;
}

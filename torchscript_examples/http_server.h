// HttpServer: an HTTP/1.1 server on one event-loop thread (epoll) that slow or hostile clients cannot stall.
//
// - Keep-alive, with TCP_NODELAY on every connection and each answer written in one writev (head and body), so an
//   answer never waits for the client's delayed ACK. Pipelined requests are answered in order, one at a time.
//   HTTP/1.0 keeps the connection only when asked (Connection: keep-alive), and the answer says so. HEAD reaches the
//   handler as GET and is answered without the body.
// - Deadlines that do not restart per byte: a request's head must arrive within header_timeout of its first byte,
//   its body within body_timeout of the end of its head, and the client must take an answer within write_timeout;
//   a connection between requests is closed after idle_timeout. Late heads and bodies get 408.
// - At most max_connections at once: past that, the connection idle the longest is closed to make room, and when
//   none is idle the newcomer gets 503 (a listen backlog of `backlog` holds connections not yet accepted).
// - Limits on the head and the body (HttpRequestParser: chunked bodies included); only one request per connection
//   is read at a time, so memory is bounded by max_connections x (max_head_bytes + one answer) plus the bodies
//   being read (max_body_bytes each, twice that for a moment while a body is handed to a worker: docs/torchscript.md
//   gives the whole bound, parsing included).
// - stop() (from any thread; not a signal handler): takes the connections already waiting in the backlog, stops
//   listening, answers every request it has received whole, closes the rest, and run() returns when all answers
//   are written.
//
// The handler runs on the event-loop thread and must not block: it answers at once, or hands the request and its
// Responder to other threads, which answer later (Responder::respond is thread-safe). A Responder dropped without
// answering answers 500, so a forgotten request never hangs its connection.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "http_request_parser.h"

namespace speedtorch::serving {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // more headers, written as given
  std::string body;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: the kernel picks a free one (HttpServer::port() says which)
  HttpLimits limits;
  int max_connections = 1024;
  int backlog = 4096;  // the kernel caps it at net.core.somaxconn
  double idle_timeout_s = 60;
  double header_timeout_s = 10;
  double body_timeout_s = 60;
  double write_timeout_s = 60;
};

// Where a Responder's answer goes: the server holding the request's connection (HttpServer; issue 34's measurement
// prototype on Boost.Beast, bench/experiments/http_beast/, is one too). post() is called from any thread.
class ResponseSink {
 public:
  virtual void post(uint64_t id, HttpResponse response) = 0;

 protected:
  ~ResponseSink() = default;
};

// The way back to the connection a request came on. Move-only; answer once, from any thread.
class Responder {
 public:
  Responder(ResponseSink* server, uint64_t id) : server_(server), id_(id) {}
  Responder(Responder&& other) noexcept : server_(std::exchange(other.server_, nullptr)), id_(other.id_) {}
  Responder& operator=(Responder&&) = delete;
  Responder(const Responder&) = delete;
  ~Responder();

  void respond(HttpResponse response);

 private:
  ResponseSink* server_;
  uint64_t id_;
};

class HttpServer : private ResponseSink {
 public:
  using Handler = std::function<void(HttpRequest&& request, Responder responder)>;
  // Called on the event-loop thread for every answer written (or refused request): the method and path ("" when
  // the request line could not be read), the status, and the seconds from the whole request to its answer
  // (-1 for a request refused before it was whole).
  using Observer = std::function<void(const std::string& method, const std::string& path, int status, double seconds)>;

  // Binds and listens; throws std::runtime_error saying why when it cannot.
  HttpServer(HttpServerOptions options, Handler handler, Observer observer = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  // The event loop; returns after stop() once every received request is answered.
  void run();
  // Thread-safe; not async-signal-safe (call it from a thread, stop_signal_watcher.h).
  void stop();

 private:
  using Clock = std::chrono::steady_clock;
  struct Connection;

  void post(uint64_t id, HttpResponse response) override;  // from Responder, any thread
  void wake();
  void accept_all();
  void on_readable(Connection& c);
  void advance(Connection& c);  // parse what has arrived; dispatch a whole request
  void send_answer(Connection& c, HttpResponse response, bool refused);
  void flush(Connection& c);  // write what is pending
  void after_answer(Connection& c);
  void refuse(Connection& c, int status, const std::string& message);
  void begin_stop();
  void check_deadlines(Clock::time_point now);
  void watch(Connection& c, uint32_t events);
  void close(uint64_t id);

  HttpServerOptions options_;
  Handler handler_;
  Observer observer_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  uint64_t next_id_ = 2;  // 0: the listener, 1: the wake-up eventfd
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<int64_t> unanswered_{0};  // Responders handed out and not yet answered: run() outlives them all
  bool stopping_ = false;
  std::mutex answers_mutex_;
  std::vector<std::pair<uint64_t, HttpResponse>> answers_;  // posted by Responders, written by the loop
};

}  // namespace speedtorch::serving

// MEASUREMENT PROTOTYPE for issue 34 item 2, not the server: the example server's HTTP front end on Boost.Beast
// (libboost-dev, header-only), to time it against our own epoll layer (torchscript_examples/http_server.h) with the
// same routes (RecommenderRoutes), batcher, model runner and metrics behind it. bench/RESULTS.md (2026-11-29) has
// the figures.
//
// What it does as ours does: one event-loop thread (an asio::io_context run by run()); keep-alive with TCP_NODELAY;
// one request per connection at a time (pipelined requests wait in the read buffer and are answered in order);
// answers posted from any thread (ResponseSink::post); HEAD answered as GET without the body; HTTP/1.0 keep-alive
// said in the answer; a POST with neither Content-Length nor chunked gets 411; head and body limits (431, 413,
// chunked bodies included, by Beast's parser); the observer called for every answer (metrics).
// What it does NOT do (a full port would have to add it, on asio timers and our own bookkeeping): 408 for slow heads
// and bodies (here a deadline per read closes the connection without an answer), the connection cap with its
// idle-first eviction and 503, Expect: 100-continue, heads with bare-LF lines (Beast refuses them: 400), the
// draining stop (stop() here closes everything at once), lingering after a refusal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include "http_server.h"

namespace speedtorch::serving::prototype {

class BeastHttpServer : private ResponseSink {
 public:
  BeastHttpServer(HttpServerOptions options, HttpServer::Handler handler, HttpServer::Observer observer = nullptr);
  ~BeastHttpServer();
  BeastHttpServer(const BeastHttpServer&) = delete;
  BeastHttpServer& operator=(const BeastHttpServer&) = delete;

  int port() const { return port_; }
  void run();   // the event loop, on the calling thread; returns after stop()
  void stop();  // thread-safe

 private:
  struct Impl;
  struct Session;
  void post(uint64_t id, HttpResponse response) override;

  HttpServerOptions options_;
  HttpServer::Handler handler_;
  HttpServer::Observer observer_;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace speedtorch::serving::prototype

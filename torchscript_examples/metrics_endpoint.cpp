// Request timing through httplib's hooks and the GET /metrics route (see metrics_endpoint.h).
//
// httplib answers each request on one pool thread from routing to logging, so the start time can wait in a
// thread_local between its pre-routing handler and its logger. A request refused before routing (a malformed
// request line) reaches the logger without a start: it is counted, not timed.
#include "metrics_endpoint.h"

#include <chrono>
#include <optional>

namespace speedtorch::serving {
namespace {

using Clock = std::chrono::steady_clock;

thread_local std::optional<Clock::time_point> t_request_start;

}  // namespace

void serve_metrics(httplib::Server& server, RequestMetrics& metrics) {
  server.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    t_request_start = Clock::now();
    return httplib::Server::HandlerResponse::Unhandled;
  });
  server.set_logger([&metrics](const httplib::Request& req, const httplib::Response& res) {
    double seconds = -1;
    if (t_request_start) {
      seconds = std::chrono::duration<double>(Clock::now() - *t_request_start).count();
      t_request_start.reset();
    }
    metrics.observe(req.method, req.path, res.status, seconds);
  });
  server.Get("/metrics", [&metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.prometheus_text(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

}  // namespace speedtorch::serving

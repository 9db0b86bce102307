// GET /metrics for an httplib server: times every request (from routing to the answer written) into a
// RequestMetrics and serves its Prometheus text. One call, after the routes are registered or before: it uses the
// server's pre-routing handler and logger, which must not be set elsewhere.
#pragma once

#include <httplib.h>

#include "request_metrics.h"

namespace speedtorch::serving {

// `metrics` must outlive the server.
void serve_metrics(httplib::Server& server, RequestMetrics& metrics);

}  // namespace speedtorch::serving

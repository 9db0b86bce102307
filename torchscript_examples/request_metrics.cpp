// Request counts, latency histograms and the library counters as Prometheus text (see request_metrics.h).
#include "request_metrics.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "metrics/transfer_counters.h"
#include "prometheus_text.h"

namespace speedtorch::serving {
namespace {

const std::string kOther = "other";

// The methods HTTP defines (RFC 9110); any other token a client sends is counted as "other", so made-up methods
// cannot grow the series, and every label value is ASCII.
const std::string& method_label(const std::string& method) {
  static const std::vector<std::string> known = {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS",
                                                 "TRACE", "PATCH"};
  const auto it = std::find(known.begin(), known.end(), method);
  return it == known.end() ? kOther : *it;
}

}  // namespace

std::vector<double> RequestMetrics::default_latency_bounds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

RequestMetrics::RequestMetrics(std::vector<std::string> endpoints, std::vector<double> latency_bounds)
    : endpoints_(std::move(endpoints)), bounds_(std::move(latency_bounds)) {
  TORCH_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()) &&
                  std::adjacent_find(bounds_.begin(), bounds_.end()) == bounds_.end(),
              "RequestMetrics: latency bounds must be strictly increasing");
}

const std::string& RequestMetrics::endpoint_of(const std::string& path) const {
  const auto known = std::find(endpoints_.begin(), endpoints_.end(), path);
  return known == endpoints_.end() ? kOther : *known;
}

void RequestMetrics::observe(const std::string& method, const std::string& path, int status, double seconds) {
  const std::string& endpoint = endpoint_of(path);
  const std::string& method_name = method_label(method);
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{method_name, endpoint, status}];
  if (seconds < 0) return;
  Latency& latency = latency_[{method_name, endpoint}];
  if (latency.buckets.empty()) latency.buckets.assign(bounds_.size() + 1, 0);
  // The first bucket whose bound is >= seconds (le: "less than or equal").
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin();
  ++latency.buckets[bucket];
  latency.sum += seconds;
}

std::string RequestMetrics::prometheus_text() const {
  std::vector<Sample> requests;
  std::vector<HistogramSample> latencies;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, count] : requests_) {
      const auto& [method, endpoint, status] = key;
      requests.push_back({{{"method", method}, {"endpoint", endpoint}, {"status", std::to_string(status)}},
                          static_cast<double>(count)});
    }
    for (const auto& [key, latency] : latency_) {
      latencies.push_back({{{"method", key.first}, {"endpoint", key.second}}, bounds_, latency.buckets, latency.sum});
    }
  }
  PrometheusText text;
  text.counter("speedtorch_server_requests_total", "HTTP requests answered, by method, endpoint and status",
               requests);
  text.histogram("speedtorch_server_request_duration_seconds",
                 "Time from routing a request to writing its answer, by method and endpoint", latencies);
  for (const metrics::CounterValue& c : metrics::snapshot()) {
    text.counter(std::string("speedtorch_") + c.name + "_total", c.help, {{{}, static_cast<double>(c.value)}});
  }
  return text.text();
}

}  // namespace speedtorch::serving

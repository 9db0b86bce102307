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

// Requests per batch, and seconds a request waits for its batch (the window is about 1 ms).
const std::vector<double>& batch_size_bounds() {
  static const std::vector<double> bounds = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  return bounds;
}
const std::vector<double>& queue_wait_bounds() {
  static const std::vector<double> bounds = {0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 1};
  return bounds;
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
  latency_[{method_name, endpoint}].add(bounds_, seconds);
}

void RequestMetrics::Latency::add(const std::vector<double>& bounds, double value) {
  if (buckets.empty()) buckets.assign(bounds.size() + 1, 0);
  // The first bucket whose bound is >= value (le: "less than or equal").
  ++buckets[std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin()];
  sum += value;
}

void RequestMetrics::observe_batch(const std::string& model, const std::vector<double>& queue_waits) {
  TORCH_CHECK(model == "lookup" || model == "score", "RequestMetrics: no batched model '", model, "'");
  std::lock_guard<std::mutex> lock(mutex_);
  batch_sizes_[model].add(batch_size_bounds(), static_cast<double>(queue_waits.size()));
  Latency& waits = queue_waits_[model];
  for (const double w : queue_waits) waits.add(queue_wait_bounds(), w);
}

std::string RequestMetrics::prometheus_text() const {
  std::vector<Sample> requests;
  std::vector<HistogramSample> latencies, batch_sizes, queue_waits;
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
    for (const auto& [model, h] : batch_sizes_) {
      batch_sizes.push_back({{{"model", model}}, batch_size_bounds(), h.buckets, h.sum});
    }
    for (const auto& [model, h] : queue_waits_) {
      queue_waits.push_back({{{"model", model}}, queue_wait_bounds(), h.buckets, h.sum});
    }
  }
  PrometheusText text;
  text.counter("speedtorch_server_requests_total", "HTTP requests answered, by method, endpoint and status",
               requests);
  text.histogram("speedtorch_server_request_duration_seconds",
                 "Time from a request received whole to its answer written, by method and endpoint", latencies);
  text.histogram("speedtorch_server_batch_size", "Requests merged into one model call by the dynamic batcher, by "
                 "model", batch_sizes);
  text.histogram("speedtorch_server_queue_wait_seconds", "Time a request waited for its batch's model call, by "
                 "model", queue_waits);
  for (const metrics::CounterValue& c : metrics::snapshot()) {
    text.counter(std::string("speedtorch_") + c.name + "_total", c.help, {{{}, static_cast<double>(c.value)}});
  }
  return text.text();
}

}  // namespace speedtorch::serving

// What GET /metrics serves: per-endpoint request counts (by method and status) and latency histograms, recorded by
// the HTTP layer (http_server.h's observer), batch sizes and queue waits recorded by the batcher (request_batcher.h),
// plus the speedtorch library counters (csrc/metrics/transfer_counters.h), all as Prometheus text
// (prometheus_text.h). Free of the HTTP layer so GoogleTest can drive it directly.
//
// Every label value comes from a closed set: endpoints are a fixed list given at construction, methods those HTTP
// defines; a request to any other path, or with any other method, is counted as "other", so a client probing random
// paths or methods cannot grow the series without bound (and no client text reaches the output).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace speedtorch::serving {

class RequestMetrics {
 public:
  // Latency bucket bounds in seconds: 0.5 ms to 10 s.
  static std::vector<double> default_latency_bounds();

  explicit RequestMetrics(std::vector<std::string> endpoints,
                          std::vector<double> latency_bounds = default_latency_bounds());

  // One request answered with `status`. `seconds` < 0: its latency is unknown (a request the HTTP layer refused
  // before routing it): counted, not timed.
  void observe(const std::string& method, const std::string& path, int status, double seconds);

  // One batch of the dynamic batcher (request_batcher.h) for `model` ("lookup" or "score"): its size is the number of
  // requests merged, `queue_waits` how long each waited in the queue (seconds).
  void observe_batch(const std::string& model, const std::vector<double>& queue_waits);

  // The request families, the batch families, then every library counter as speedtorch_<name>_total.
  std::string prometheus_text() const;

 private:
  struct Latency {  // a histogram's buckets and sum
    std::vector<uint64_t> buckets;  // per bucket, one above the last bound
    double sum = 0;
    void add(const std::vector<double>& bounds, double value);
  };
  const std::string& endpoint_of(const std::string& path) const;

  std::vector<std::string> endpoints_;
  std::vector<double> bounds_;
  mutable std::mutex mutex_;  // a request holds it for a few map updates; the work it measures takes far longer
  std::map<std::tuple<std::string, std::string, int>, uint64_t> requests_;  // (method, endpoint, status)
  std::map<std::pair<std::string, std::string>, Latency> latency_;           // (method, endpoint)
  std::map<std::string, Latency> batch_sizes_;                                // by model
  std::map<std::string, Latency> queue_waits_;                                // by model
};

}  // namespace speedtorch::serving

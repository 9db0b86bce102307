// Tests for request_metrics: requests counted per method, endpoint and status; latencies in the right bucket;
// unknown paths folded into "other"; the library counters included.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "metrics/transfer_counters.h"
#include "request_metrics.h"

namespace speedtorch::serving {
namespace {

bool contains(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

TEST(RequestMetrics, CountsRequestsAndBucketsLatencies) {
  // Binary fractions: the sum is exact.
  RequestMetrics m({"/lookup", "/metrics"}, {0.125, 0.5});
  m.observe("POST", "/lookup", 200, 0.0625);
  m.observe("POST", "/lookup", 200, 0.125);  // le is inclusive: still the first bucket
  m.observe("POST", "/lookup", 404, 0.25);
  m.observe("POST", "/lookup", 200, 3.0);
  m.observe("GET", "/nowhere", 404, 0.001);
  m.observe("GET", "/metrics", 400, -1);  // refused before routing: counted, not timed
  const std::string t = m.prometheus_text();
  EXPECT_TRUE(contains(t, "# TYPE speedtorch_server_requests_total counter")) << t;
  EXPECT_TRUE(contains(t, "speedtorch_server_requests_total{method=\"POST\",endpoint=\"/lookup\",status=\"200\"} 3"));
  EXPECT_TRUE(contains(t, "speedtorch_server_requests_total{method=\"POST\",endpoint=\"/lookup\",status=\"404\"} 1"));
  EXPECT_TRUE(contains(t, "speedtorch_server_requests_total{method=\"GET\",endpoint=\"other\",status=\"404\"} 1"));
  EXPECT_TRUE(contains(t, "speedtorch_server_requests_total{method=\"GET\",endpoint=\"/metrics\",status=\"400\"} 1"));
  EXPECT_TRUE(contains(t, "# TYPE speedtorch_server_request_duration_seconds histogram"));
  const std::string h = "speedtorch_server_request_duration_seconds";
  EXPECT_TRUE(contains(t, h + "_bucket{method=\"POST\",endpoint=\"/lookup\",le=\"0.125\"} 2")) << t;
  EXPECT_TRUE(contains(t, h + "_bucket{method=\"POST\",endpoint=\"/lookup\",le=\"0.5\"} 3"));
  EXPECT_TRUE(contains(t, h + "_bucket{method=\"POST\",endpoint=\"/lookup\",le=\"+Inf\"} 4"));
  EXPECT_TRUE(contains(t, h + "_sum{method=\"POST\",endpoint=\"/lookup\"} 3.4375"));
  EXPECT_TRUE(contains(t, h + "_count{method=\"POST\",endpoint=\"/lookup\"} 4"));
  EXPECT_TRUE(contains(t, h + "_count{method=\"GET\",endpoint=\"other\"} 1"));
  EXPECT_EQ(t.find(h + "_count{method=\"GET\",endpoint=\"/metrics\"}"), std::string::npos);  // never timed
}

// Methods a client makes up (any token, bytes that are not UTF-8) share one series, like unknown paths: the
// series stay few however many a client sends, and the text stays ASCII.
TEST(RequestMetrics, MadeUpMethodsFoldIntoOther) {
  RequestMetrics m({"/lookup"});
  for (int i = 0; i < 100; ++i) m.observe("M" + std::to_string(i), "/lookup", 400, 0.001);
  m.observe("G\xff\xfeT", "/lookup", 400, 0.001);
  m.observe("post", "/lookup", 400, 0.001);  // methods are case-sensitive
  m.observe("DELETE", "/lookup", 404, 0.001);
  const std::string t = m.prometheus_text();
  EXPECT_TRUE(contains(t, "speedtorch_server_requests_total{method=\"other\",endpoint=\"/lookup\",status=\"400\"} 102"))
      << t;
  EXPECT_TRUE(contains(t, "speedtorch_server_requests_total{method=\"DELETE\",endpoint=\"/lookup\",status=\"404\"} 1"));
  EXPECT_EQ(t.find("M1"), std::string::npos);
  EXPECT_TRUE(std::all_of(t.begin(), t.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
}

TEST(RequestMetrics, IncludesTheLibraryCounters) {
  metrics::reset();
  metrics::add_cache_lookups(5, 2);
  const std::string t = RequestMetrics({}).prometheus_text();
  EXPECT_TRUE(contains(t, "# TYPE speedtorch_cache_hits_total counter")) << t;
  EXPECT_TRUE(contains(t, "speedtorch_cache_hits_total 5"));
  EXPECT_TRUE(contains(t, "speedtorch_cache_misses_total 2"));
  for (const metrics::CounterValue& c : metrics::snapshot()) {
    EXPECT_TRUE(contains(t, std::string("# HELP speedtorch_") + c.name + "_total " + c.help)) << c.name;
  }
  metrics::reset();
}

TEST(RequestMetrics, ConcurrentObservationsAreAllCounted) {
  RequestMetrics m({"/a"});
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 1000; ++k) m.observe("GET", "/a", 200, 0.001);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(contains(m.prometheus_text(),
                       "speedtorch_server_requests_total{method=\"GET\",endpoint=\"/a\",status=\"200\"} 4000"));
}

}  // namespace
}  // namespace speedtorch::serving

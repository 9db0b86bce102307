// Tests for prometheus_text: the exact text of each family kind, escaping, number spelling, and refusals of what
// the format does not allow.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

#include "prometheus_text.h"

namespace speedtorch::serving {
namespace {

TEST(PrometheusText, CounterHasHelpTypeAndLabelledSamples) {
  PrometheusText text;
  text.counter("app_requests_total", "Requests answered", {{{{"endpoint", "/a"}, {"status", "200"}}, 3}, {{}, 7}});
  EXPECT_EQ(text.text(),
            "# HELP app_requests_total Requests answered\n"
            "# TYPE app_requests_total counter\n"
            "app_requests_total{endpoint=\"/a\",status=\"200\"} 3\n"
            "app_requests_total 7\n");
}

TEST(PrometheusText, GaugeAllowsNegativeAndFractionalValues) {
  PrometheusText text;
  text.gauge("app_temperature", "Degrees", {{{}, -1.5}});
  EXPECT_EQ(text.text(), "# HELP app_temperature Degrees\n# TYPE app_temperature gauge\napp_temperature -1.5\n");
}

TEST(PrometheusText, HistogramIsCumulativeWithInfSumAndCount) {
  PrometheusText text;
  text.histogram("app_seconds", "Latency", {{{{"endpoint", "/a"}}, {0.005, 0.1}, {2, 0, 1}, 0.75}});
  EXPECT_EQ(text.text(),
            "# HELP app_seconds Latency\n"
            "# TYPE app_seconds histogram\n"
            "app_seconds_bucket{endpoint=\"/a\",le=\"0.005\"} 2\n"
            "app_seconds_bucket{endpoint=\"/a\",le=\"0.1\"} 2\n"
            "app_seconds_bucket{endpoint=\"/a\",le=\"+Inf\"} 3\n"
            "app_seconds_sum{endpoint=\"/a\"} 0.75\n"
            "app_seconds_count{endpoint=\"/a\"} 3\n");
}

TEST(PrometheusText, EscapesLabelValuesAndHelp) {
  PrometheusText text;
  text.counter("x_total", "a \\ b\nc \"q\"", {{{{"path", "a\"b\\c\nd"}}, 1}});
  EXPECT_EQ(text.text(),
            "# HELP x_total a \\\\ b\\nc \"q\"\n"
            "# TYPE x_total counter\n"
            "x_total{path=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(PrometheusText, NumbersAreExactAndShort) {
  EXPECT_EQ(prometheus_number(0), "0");
  EXPECT_EQ(prometheus_number(9007199254740992.0), "9007199254740992");
  EXPECT_EQ(prometheus_number(0.005), "0.005");
  EXPECT_EQ(prometheus_number(2.5), "2.5");
  EXPECT_EQ(prometheus_number(1e300), "1e+300");
  EXPECT_EQ(prometheus_number(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(prometheus_number(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(prometheus_number(std::nan("")), "NaN");
  const double third = 1.0 / 3.0;
  EXPECT_EQ(std::strtod(prometheus_number(third).c_str(), nullptr), third);
}

TEST(PrometheusText, RefusesWhatTheFormatForbids) {
  PrometheusText text;
  EXPECT_THROW(text.counter("requests", "no _total suffix", {}), c10::Error);
  EXPECT_THROW(text.gauge("1bad", "starts with a digit", {}), c10::Error);
  EXPECT_THROW(text.gauge("bad-name", "has a dash", {}), c10::Error);
  EXPECT_THROW(text.gauge("g1", "bad label", {{{{"bad-label", "v"}}, 1}}), c10::Error);
  EXPECT_THROW(text.gauge("g2", "reserved label", {{{{"__name", "v"}}, 1}}), c10::Error);
  EXPECT_THROW(text.counter("c_total", "negative", {{{}, -1}}), c10::Error);
  EXPECT_THROW(text.histogram("h1", "unsorted", {{{}, {0.2, 0.1}, {0, 0, 0}, 0}}), c10::Error);
  EXPECT_THROW(text.histogram("h2", "counts", {{{}, {0.1}, {1}, 0}}), c10::Error);
  EXPECT_THROW(text.histogram("h3", "le label", {{{{"le", "1"}}, {0.1}, {1, 0}, 0}}), c10::Error);
  text.gauge("twice", "once", {});
  EXPECT_THROW(text.gauge("twice", "again", {}), c10::Error);
}

}  // namespace
}  // namespace speedtorch::serving

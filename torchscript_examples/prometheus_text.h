// Writes metrics in the Prometheus text exposition format (version 0.0.4): one family per call, each with its
// # HELP and # TYPE lines, then its samples. Counters' names end in _total; a histogram is written as cumulative
// _bucket{le="..."} samples (the last one le="+Inf"), then _sum and _count.
//
// Names and label names are checked against the format's grammar; label values and help text are escaped. Kept
// apart from the HTTP server so GoogleTest can check the text exactly.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace speedtorch::serving {

using Labels = std::vector<std::pair<std::string, std::string>>;  // name, value; written in this order

struct Sample {
  Labels labels;
  double value = 0;
};

struct HistogramSample {
  Labels labels;
  std::vector<double> upper_bounds;    // finite, strictly increasing; "+Inf" is added
  std::vector<uint64_t> bucket_counts;  // per bucket, not cumulative: one per bound, then one above the last
  double sum = 0;
};

class PrometheusText {
 public:
  // `name` must end in _total.
  void counter(const std::string& name, const std::string& help, const std::vector<Sample>& samples);
  void gauge(const std::string& name, const std::string& help, const std::vector<Sample>& samples);
  // `name` without suffix: _bucket, _sum and _count are appended.
  void histogram(const std::string& name, const std::string& help, const std::vector<HistogramSample>& samples);

  const std::string& text() const { return text_; }

 private:
  void family(const std::string& name, const std::string& help, const char* type);
  void sample(const std::string& name, const Labels& labels, double value);

  std::string text_;
  std::vector<std::string> families_;  // names written so far: a family appears once
};

// A sample value as the format spells it: integers exactly, others with enough digits to read back the same
// double, and +Inf, -Inf, NaN.
std::string prometheus_number(double value);
// A label value with \, " and newline escaped.
std::string escape_label_value(const std::string& value);

}  // namespace speedtorch::serving

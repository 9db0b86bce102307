// The Prometheus text format writer (see prometheus_text.h).
#include "prometheus_text.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace speedtorch::serving {
namespace {

bool is_name_start(char c, bool colon_allowed) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon_allowed && c == ':');
}

// Metric names: [a-zA-Z_:][a-zA-Z0-9_:]*; label names: [a-zA-Z_][a-zA-Z0-9_]*, never starting with __.
bool valid_name(const std::string& name, bool metric) {
  if (name.empty() || !is_name_start(name[0], metric)) return false;
  if (!metric && name.rfind("__", 0) == 0) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return is_name_start(c, metric) || (c >= '0' && c <= '9'); });
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Help text: backslash and newline escaped (quotes stay as they are there).
std::string escape_help(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

std::string prometheus_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  // Integers up to 2^53 are exact in a double: written without exponent or fraction.
  if (value == std::floor(value) && std::fabs(value) <= 9007199254740992.0) {
    std::snprintf(buffer, sizeof buffer, "%.0f", value);
    return buffer;
  }
  // The shortest form that reads back as the same double (0.005, not 0.0050000000000000001).
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buffer, sizeof buffer, "%.*g", digits, value);
    if (std::strtod(buffer, nullptr) == value) break;
  }
  return buffer;
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void PrometheusText::family(const std::string& name, const std::string& help, const char* type) {
  TORCH_CHECK(valid_name(name, /*metric=*/true), "Prometheus metric name '", name,
              "' is not of the form [a-zA-Z_:][a-zA-Z0-9_:]*");
  TORCH_CHECK(std::find(families_.begin(), families_.end(), name) == families_.end(), "Prometheus metric family '",
              name, "' written twice: each family must appear once, with all its samples");
  families_.push_back(name);
  text_ += "# HELP " + name + " " + escape_help(help) + "\n";
  text_ += "# TYPE " + name + " " + type + "\n";
}

void PrometheusText::sample(const std::string& name, const Labels& labels, double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      TORCH_CHECK(valid_name(labels[i].first, /*metric=*/false), "Prometheus label name '", labels[i].first,
                  "' of ", name, " is not of the form [a-zA-Z_][a-zA-Z0-9_]* (or starts with __)");
      text_ += (i ? "," : "") + labels[i].first + "=\"" + escape_label_value(labels[i].second) + "\"";
    }
    text_ += '}';
  }
  text_ += " " + prometheus_number(value) + "\n";
}

void PrometheusText::counter(const std::string& name, const std::string& help, const std::vector<Sample>& samples) {
  TORCH_CHECK(ends_with(name, "_total"), "Prometheus counter '", name, "' must end in _total");
  family(name, help, "counter");
  for (const Sample& s : samples) {
    TORCH_CHECK(s.value >= 0, "Prometheus counter ", name, " must not be negative, got ", s.value);
    sample(name, s.labels, s.value);
  }
}

void PrometheusText::gauge(const std::string& name, const std::string& help, const std::vector<Sample>& samples) {
  family(name, help, "gauge");
  for (const Sample& s : samples) sample(name, s.labels, s.value);
}

void PrometheusText::histogram(const std::string& name, const std::string& help,
                               const std::vector<HistogramSample>& samples) {
  family(name, help, "histogram");
  for (const HistogramSample& h : samples) {
    TORCH_CHECK(h.bucket_counts.size() == h.upper_bounds.size() + 1, "Prometheus histogram ", name, ": ",
                h.upper_bounds.size(), " bounds need ", h.upper_bounds.size() + 1, " bucket counts, got ",
                h.bucket_counts.size());
    for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
      TORCH_CHECK(std::isfinite(h.upper_bounds[i]) && (i == 0 || h.upper_bounds[i] > h.upper_bounds[i - 1]),
                  "Prometheus histogram ", name, ": bucket bounds must be finite and strictly increasing");
    }
    for (const auto& label : h.labels) {
      TORCH_CHECK(label.first != "le", "Prometheus histogram ", name, ": the label 'le' is the format's own");
    }
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= h.upper_bounds.size(); ++i) {
      cumulative += h.bucket_counts[i];
      Labels labels = h.labels;
      labels.emplace_back("le", i < h.upper_bounds.size() ? prometheus_number(h.upper_bounds[i]) : "+Inf");
      sample(name + "_bucket", labels, static_cast<double>(cumulative));
    }
    sample(name + "_sum", h.labels, h.sum);
    sample(name + "_count", h.labels, static_cast<double>(cumulative));
  }
}

}  // namespace speedtorch::serving

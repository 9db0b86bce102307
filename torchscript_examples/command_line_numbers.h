// Numbers read from a command line, whole or not at all: strtol/atoi take "4x" as 4 and "abc" as 0, so a typo ran
// with a value nobody asked for. One rule for the example programs (server, trainer, load client).
#pragma once

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

namespace speedtorch::examples {

// `text` as a whole decimal integer in [min, max]; nothing when it is empty, has spaces or other characters around
// the digits, or lies outside the range.
inline std::optional<long long> whole_integer(const std::string& text, long long min, long long max) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || errno == ERANGE || value < min || value > max) return std::nullopt;
  return value;
}

// `text` as a whole finite decimal number (as strtod reads them) in [min, max]; nothing otherwise.
inline std::optional<double> whole_number(const std::string& text, double min, double max) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (*end != '\0' || errno == ERANGE || !std::isfinite(value) || value < min || value > max) return std::nullopt;
  return value;
}

}  // namespace speedtorch::examples

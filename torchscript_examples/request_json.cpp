// Safe reading of JSON request bodies (see request_json.h).
#include "request_json.h"

#include <cfloat>
#include <charconv>
#include <cmath>
#include <limits>

namespace speedtorch::serving {

JsonExtent json_extent(std::string_view text, int depth_limit, int64_t value_limit) {
  JsonExtent extent;
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++extent.values;  // the container's first value (an upper bound: it may be empty)
      if (++depth > extent.depth) extent.depth = depth;
      if (extent.depth > depth_limit) return extent;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    } else if (c == ',' && ++extent.values > value_limit) {
      return extent;
    }
  }
  return extent;
}

int json_nesting_depth(std::string_view text, int limit) {
  return json_extent(text, limit, std::numeric_limits<int64_t>::max()).depth;
}

std::optional<nlohmann::json> parse_json_object(std::string_view body, std::string& error) {
  const JsonExtent extent = json_extent(body);
  if (extent.depth > kMaxJsonDepth) {
    error = "the request body nests lists or objects deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return std::nullopt;
  }
  if (extent.values > kMaxJsonValues) {
    error = "the request body holds more than " + std::to_string(kMaxJsonValues) +
            " values; split the request (or send ids as a binary tensor, /v2)";
    return std::nullopt;
  }
  nlohmann::json value = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    // Not nlohmann's message: it quotes the input, which may not be UTF-8.
    error = "the request body is not valid JSON (or holds a number beyond double range)";
    return std::nullopt;
  }
  if (!value.is_object()) {
    error = "the request body must be a JSON object";
    return std::nullopt;
  }
  return value;
}

std::string describe(const nlohmann::json& value) {
  if (value.is_array()) return "a list of " + std::to_string(value.size()) + " values";
  if (value.is_object()) return "an object of " + std::to_string(value.size()) + " fields";
  std::string text = value.dump();  // a scalar: not recursive
  if (text.size() > 64) {
    std::size_t cut = 61;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // whole UTF-8 characters
    text = text.substr(0, cut) + "...";
  }
  return text;
}

bool beyond_int64(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  return value.is_number_float() && std::fabs(value.get<double>()) >= 0x1p63;
}

std::optional<int64_t> read_id(const nlohmann::json& value, int64_t limit, const std::string& field, int& status,
                               std::string& error) {
  const bool beyond = beyond_int64(value);
  if (!value.is_number_integer() && !beyond) {
    status = 400;
    error = "field '" + field + "' must hold integers only, got " + describe(value);
    return std::nullopt;
  }
  if (beyond || value.get<int64_t>() < 0 || value.get<int64_t>() >= limit) {
    status = 404;
    error = "unknown id " + value.dump() + " in '" + field + "': ids are in [0, " + std::to_string(limit) + ")";
    return std::nullopt;
  }
  return value.get<int64_t>();
}

void append_json_floats(std::string& out, const float* values, std::size_t n) {
  char buffer[32];
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += ',';
    if (values[i] == 0 && std::signbit(values[i])) {
      out += "-0.0";  // "-0" would be read as the integer 0
      continue;
    }
    const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, static_cast<double>(values[i]));
    out.append(buffer, end);
  }
}

std::optional<float> read_float(const nlohmann::json& value, std::string& error) {
  if (!value.is_number()) {
    error = "rows must hold numbers only, got " + describe(value);
    return std::nullopt;
  }
  const double d = value.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > FLT_MAX) {
    error = "row value " + value.dump() + " is outside the float32 range (|x| <= 3.4028235e38)";
    return std::nullopt;
  }
  return static_cast<float>(d);
}

}  // namespace speedtorch::serving

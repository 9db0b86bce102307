// The JSON our meta files use (io/embedding_files.h): objects with string keys whose values are numbers, strings,
// booleans, null or nested objects. Written by us, read back by us or by any JSON library (Python's json module
// included, Infinity and NaN as it writes them); arrays are not needed and not accepted.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace speedtorch::io {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<std::pair<std::string, JsonValue>> members;  // in file order

  static JsonValue of(double v);
  static JsonValue of(std::string v);
  static JsonValue object();
  // Appends a member to an object.
  JsonValue& set(const std::string& key, JsonValue value);
  // The member named `key`, or nullptr.
  const JsonValue* find(const std::string& key) const;
};

// Parses `text`; `name` names the file in error messages (c10::Error on malformed input).
JsonValue parse_json(const std::string& text, const std::string& name);
// Indented JSON with one member per line; numbers keep every bit of a double.
std::string to_json(const JsonValue& value);

}  // namespace speedtorch::io

// Reading the server's JSON request bodies safely: untrusted text in, checked values out, nothing recursive on the
// input. A body is refused before it is parsed when its brackets nest deeper than kMaxJsonDepth or it holds more than
// kMaxJsonValues values (one linear scan): nlohmann::json parses iteratively, but writing or comparing a value
// recurses, 60 MB of '[' parsed in full takes gigabytes, and a parsed value costs 16 to 110 bytes of memory for
// the 2 or 3 bytes of its text (docs/torchscript.md, the memory bound). Error messages describe a bad value by its type, or by its text when it is a scalar, never by
// dumping a whole list.
//
// Free of torch so that the fuzz target (tests/fuzz/fuzz_request_body.cpp) drives it directly.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace speedtorch::serving {

// Deeper than any request the server takes (a list of rows is depth 3; a v2 inference request about 6).
constexpr int kMaxJsonDepth = 32;
// More values than a request needs: 1M numbers is an /update of 8,192 rows of 128 (binary /v2 tensors are not JSON).
// It bounds what parsing one body can take, about 110 MiB for the costliest values ({}).
constexpr int64_t kMaxJsonValues = int64_t{1} << 20;

// What the scan before parsing finds in a body, outside strings: the deepest nesting of [ and { (0 for a scalar)
// and an upper bound on the number of values (1 + commas + lists and objects opened). It stops once either passes
// its limit, so a refused body is scanned only that far.
struct JsonExtent {
  int depth = 0;
  int64_t values = 1;
};
JsonExtent json_extent(std::string_view text, int depth_limit = kMaxJsonDepth,
                       int64_t value_limit = kMaxJsonValues);

// The deepest nesting of [ and { in `text` outside strings (0 for a scalar). Stops counting past `limit` + 1.
int json_nesting_depth(std::string_view text, int limit = kMaxJsonDepth);

// Parses `body` as a JSON object. On failure returns nothing and sets `error` to a message for the client.
std::optional<nlohmann::json> parse_json_object(std::string_view body, std::string& error);

// A short description of a value for an error message: scalars as their JSON text (at most 64 characters),
// lists and objects by their type ("a list of 3 values").
std::string describe(const nlohmann::json& value);

// Whether `value` is an integer beyond int64 either way: unsigned above 2^63 - 1, or a number that nlohmann read as
// floating point because no 64-bit integer holds it (2^64 and up, below -2^63). As an id it is unknown (404), as any
// id outside the table is, not malformed.
bool beyond_int64(const nlohmann::json& value);

// Reads `value` as an integer id in [0, limit). On failure returns nothing and sets `error` (`status` 400 for a
// value that is not an integer, 404 for an integer outside the range, whatever its size).
std::optional<int64_t> read_id(const nlohmann::json& value, int64_t limit, const std::string& field, int& status,
                               std::string& error);

// Appends `n` finite floats to `out` as JSON numbers separated by commas, each the shortest text of the float's
// exact double value (std::to_chars), so that a client reading doubles gets the float32 value exactly, as nlohmann
// writes it; several times faster than building nlohmann values for an answer's rows.
void append_json_floats(std::string& out, const float* values, std::size_t n);

// Reads `value` as a float32: a finite JSON number within float range (1e39 would become infinity). On failure
// returns nothing and sets `error`.
std::optional<float> read_float(const nlohmann::json& value, std::string& error);

}  // namespace speedtorch::serving

// libFuzzer target over the example server's reading of request bodies (torchscript_examples/request_json.h): the
// JSON a client sends to /lookup, /score, /topk and /update, read as the service reads it. For any bytes it must
// refuse with a message or accept, never crash, never recurse without bound (a body of 100,000 '[' once killed
// the server), and every message must be valid UTF-8 that an answer can carry. An accepted body nests at most
// kMaxJsonDepth levels and reads back the same after writing. Built and run by `make fuzz`; seeds in
// tests/fuzz/corpus/request_body/.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "request_json.h"
#include "utf8_text.h"

namespace {

using nlohmann::json;

void check_message(const std::string& message) {
  if (message.empty() || !speedtorch::fuzzing::valid_utf8(message)) {
    std::fprintf(stderr, "fuzz_request_body: an error message that is empty or not UTF-8\n");
    std::abort();
  }
  (void)json{{"error", message}}.dump();  // what the server sends: throws on text JSON cannot carry
}

// What the service does with a field: ids (a list or one), rows of floats, described in messages.
void read_fields(const json& request) {
  for (const char* name : {"ids", "users", "items", "user", "k"}) {
    if (!request.contains(name)) continue;
    const json& field = request[name];
    check_message(speedtorch::serving::describe(field));
    for (const json& v : field.is_array() ? field : json::array({field})) {
      int status = 0;
      std::string error;
      const auto id = speedtorch::serving::read_id(v, 1000, name, status, error);
      if (!id) {
        check_message(error);
        if (status != 400 && status != 404) std::abort();
      } else if (*id < 0 || *id >= 1000) {
        std::abort();
      }
    }
  }
  if (request.contains("rows") && request["rows"].is_array()) {
    for (const json& row : request["rows"]) {
      check_message(speedtorch::serving::describe(row));
      if (!row.is_array()) continue;
      for (const json& v : row) {
        std::string error;
        if (!speedtorch::serving::read_float(v, error)) check_message(error);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  std::string error;
  const auto request = speedtorch::serving::parse_json_object(body, error);
  if (!request) {
    check_message(error);
    return 0;
  }
  if (speedtorch::serving::json_nesting_depth(body) > speedtorch::serving::kMaxJsonDepth) {
    std::fprintf(stderr, "fuzz_request_body: accepted a body nested deeper than the limit\n");
    std::abort();
  }
  // Writing recurses once per level: bounded by the limit. It reads back the same.
  if (json::parse(request->dump()) != *request) std::abort();
  read_fields(*request);
  return 0;
}

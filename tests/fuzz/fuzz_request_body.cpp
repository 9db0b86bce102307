// libFuzzer target over the example server's reading of requests (torchscript_examples/): untrusted bytes, three
// readers, chosen by the first byte:
//   'H' + bytes: HTTP/1.1 requests (http_request_parser.h), fed in pieces whose sizes come from the input;
//   'V' + 2 bytes of header length (0xFFFF: none) + body: an Open Inference Protocol request (inference_protocol.h),
//       JSON tensors or Triton's binary tensors after the JSON header;
//   anything else: a JSON body of /lookup, /score, /topk or /update (request_json.h), read as the service reads it.
// For any bytes each must refuse with a message or accept, never crash, never recurse without bound (a body of
// 100,000 '[' once killed the server), and every message must be valid UTF-8 that an answer can carry. What is
// accepted must be consistent with the bytes: a JSON body nests at most kMaxJsonDepth levels and reads back the
// same; an inference input holds exactly its shape's elements and the binary bytes are all claimed; an HTTP body
// never exceeds its limit. Built and run by `make fuzz`; seeds in tests/fuzz/corpus/request_body/.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <algorithm>
#include <optional>

#include "http_request_parser.h"
#include "inference_protocol.h"
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


void fuzz_http(std::string_view bytes) {
  using speedtorch::serving::HttpRequestParser;
  speedtorch::serving::HttpLimits limits;
  limits.max_head_bytes = 512;
  limits.max_body_bytes = 1024;
  limits.max_headers = 8;
  HttpRequestParser parser(limits);
  std::size_t step = bytes.empty() ? 1 : static_cast<unsigned char>(bytes[0]) % 17 + 1;
  std::size_t at = 0;
  int requests = 0;
  while (at < bytes.size() && requests < 16) {
    const std::size_t used = parser.feed(bytes.substr(at, std::min(step, bytes.size() - at)));
    at += used;
    const auto state = parser.state();
    if (state == HttpRequestParser::State::kFailed) {
      check_message(parser.error_message());
      if (parser.error_status() < 400 || parser.error_status() > 505) std::abort();
      return;
    }
    if (parser.request().body.size() > limits.max_body_bytes) std::abort();
    if (state == HttpRequestParser::State::kComplete) {
      if (parser.request().method.empty() || parser.request().path.empty() || parser.request().path[0] != '/') {
        std::abort();
      }
      parser.reset();
      ++requests;
    } else if (used == 0 && step >= bytes.size() - at) {
      return;  // waiting for bytes that will not come
    }
  }
}

void fuzz_inference(std::string_view bytes) {
  if (bytes.size() < 2) return;
  const std::size_t length = static_cast<unsigned char>(bytes[0]) | static_cast<unsigned char>(bytes[1]) << 8;
  const std::string_view body = bytes.substr(2);
  std::optional<std::size_t> header;
  if (length != 0xFFFF) header = length;
  std::string error;
  const auto request = speedtorch::serving::parse_infer_request(body, header, 4096, error);
  if (!request) {
    check_message(error);
    return;
  }
  std::size_t binary_bytes = 0;
  for (const auto& input : request->inputs) {
    std::size_t count = 1;
    for (const int64_t d : input.shape) {
      if (d < 0) std::abort();
      count *= static_cast<std::size_t>(d);
    }
    if (count != input.values.size() || count > 4096) std::abort();
    binary_bytes += count * 8;  // at most: INT32 takes 4
  }
  if (header && body.size() - *header > binary_bytes) std::abort();  // bytes no input claims were accepted
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (!bytes.empty() && bytes[0] == 'H') {
    fuzz_http(bytes.substr(1));
    return 0;
  }
  if (!bytes.empty() && bytes[0] == 'V') {
    fuzz_inference(bytes.substr(1));
    return 0;
  }
  const std::string_view body = bytes;
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

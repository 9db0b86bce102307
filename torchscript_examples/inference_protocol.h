// The Open Inference Protocol (KServe v2, which Triton, KServe and Seldon speak) for the recommender server: reading
// an inference request and writing its answer, as JSON tensors or with Triton's binary tensor extension, so that
// tritonclient.http talks to the server unchanged.
//
// The server exposes two models (server_main.cpp):
//   lookup: input  ids   INT64 or INT32, any shape S      -> output rows   FP32, shape S + [dim]
//   score:  inputs users, items INT64 or INT32, shape S   -> output scores FP32, shape S
//
// Binary extension: the request's JSON header is the first `Inference-Header-Content-Length` bytes of the body and
// each input with parameters.binary_data_size has its raw little-endian elements after it, in input order. An
// output is answered in binary when it asks (parameters.binary_data) or the request does
// (parameters.binary_data_output); then the answer's JSON header is followed by the output's bytes and its length
// goes in the answer's Inference-Header-Content-Length.
//
// Everything here reads untrusted bytes: sizes are checked before use (no overflow, nothing past the body), JSON
// goes through parse_json_object (request_json.h: depth-limited, nothing recursive). Free of torch so that the
// fuzz target (tests/fuzz/fuzz_request_body.cpp) drives it directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http_server.h"

namespace speedtorch::serving {

struct InferInput {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> values;  // INT32 or INT64 elements, widened; row-major
};

struct InferRequest {
  std::string id;  // echoed in the answer when given
  std::vector<InferInput> inputs;
  bool binary_output = false;   // answer the output in binary
  std::string requested_output;  // empty: the model's output
};

// Reads a request. `header_length`: the Inference-Header-Content-Length header, or nothing when the whole body is
// JSON. `max_elements`: the most elements one input may have. Returns nothing and sets `error` on failure, and
// `status` when given: 413 for an input of more than max_elements, 404 for an id beyond int64 (an unknown id, as on
// /lookup), 400 for the rest.
std::optional<InferRequest> parse_infer_request(std::string_view body, std::optional<std::size_t> header_length,
                                                std::size_t max_elements, std::string& error, int* status = nullptr);

// Reads the Inference-Header-Content-Length header of a request (`header`: its value, or nullptr when absent) into
// `length`. False, with `error` set, when it is not a decimal number of at most `body_size`.
bool read_inference_header_length(const std::string* header, std::size_t body_size,
                                  std::optional<std::size_t>& length, std::string& error);

// The answer of `model` holding one FP32 output `output` of `shape` (elements `data`, row-major). In JSON, a
// non-finite element cannot be written: the answer is then a 500 saying to ask for binary output.
HttpResponse infer_answer(const std::string& model, const InferRequest& request, const std::string& output,
                          const std::vector<int64_t>& shape, const float* data);

// An error answer, of the protocol and of the server's own routes: {"error": message}.
HttpResponse error_answer(int status, const std::string& message);

}  // namespace speedtorch::serving

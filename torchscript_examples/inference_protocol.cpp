// Reading and answering Open Inference Protocol requests (see inference_protocol.h).
#include "inference_protocol.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "request_json.h"

namespace speedtorch::serving {
namespace {

using nlohmann::json;

// Element counts of a shape, or nothing when a dimension is negative or the product passes `limit`.
std::optional<std::size_t> element_count(const std::vector<int64_t>& shape, std::size_t limit) {
  std::size_t count = 1;
  for (const int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && count > limit / static_cast<std::size_t>(d)) return std::nullopt;
    count *= static_cast<std::size_t>(d);
  }
  if (count > limit) return std::nullopt;
  return count;
}

// Appends the integers of `data` (a flat or nested JSON list) to `out`, without recursion: nested lists are walked
// with an explicit stack (their depth is bounded by parse_json_object's limit anyway).
bool flatten_integers(const json& data, std::size_t limit, std::vector<int64_t>& out, std::string& error,
                      int& status) {
  std::vector<std::pair<const json*, std::size_t>> stack{{&data, 0}};
  while (!stack.empty()) {
    auto& [list, next] = stack.back();
    if (next == list->size()) {
      stack.pop_back();
      continue;
    }
    const json& v = (*list)[next++];
    if (v.is_array()) {
      stack.emplace_back(&v, 0);
      continue;
    }
    if (beyond_int64(v)) {
      status = 404;
      error = "unknown id " + v.dump() + ": ids are in [0, the table's rows)";
      return false;
    }
    if (!v.is_number_integer()) {
      error = "tensor data must be integers (int64), got " + describe(v);
      return false;
    }
    if (out.size() == limit) {
      error = "tensor data holds more elements than its shape";
      return false;
    }
    out.push_back(v.get<int64_t>());
  }
  return true;
}

bool truthy_parameter(const json& holder, const char* name) {
  if (!holder.is_object() || !holder.contains("parameters")) return false;
  const json& parameters = holder["parameters"];
  return parameters.is_object() && parameters.contains(name) && parameters[name].is_boolean() &&
         parameters[name].get<bool>();
}

}  // namespace

bool read_inference_header_length(const std::string* header, std::size_t body_size,
                                  std::optional<std::size_t>& length, std::string& error) {
  length.reset();
  if (header == nullptr) return true;
  const bool digits = !header->empty() && header->size() <= 18 &&
                      std::all_of(header->begin(), header->end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stoull(*header) > body_size) {
    error = "Inference-Header-Content-Length must be a decimal number of bytes within the body";
    return false;
  }
  length = std::stoull(*header);
  return true;
}

std::optional<InferRequest> parse_infer_request(std::string_view body, std::optional<std::size_t> header_length,
                                                std::size_t max_elements, std::string& error, int* status) {
  int unused;
  int& why = status != nullptr ? *status : unused;
  why = 400;
  const std::size_t json_size = header_length ? *header_length : body.size();
  if (json_size > body.size()) {
    error = "Inference-Header-Content-Length is beyond the body";
    return std::nullopt;
  }
  const auto parsed = parse_json_object(body.substr(0, json_size), error);
  if (!parsed) return std::nullopt;
  const json& request = *parsed;
  InferRequest out;
  if (request.contains("id")) {
    if (!request["id"].is_string()) {
      error = "'id' must be a string";
      return std::nullopt;
    }
    out.id = request["id"].get<std::string>();
  }
  if (!request.contains("inputs") || !request["inputs"].is_array() || request["inputs"].empty()) {
    error = "'inputs' must be a non-empty list of tensors";
    return std::nullopt;
  }
  std::string_view binary = body.substr(json_size);
  for (const json& input : request["inputs"]) {
    InferInput tensor;
    if (!input.is_object() || !input.contains("name") || !input["name"].is_string()) {
      error = "every input must be an object with a 'name'";
      return std::nullopt;
    }
    tensor.name = input["name"].get<std::string>();
    if (!input.contains("datatype") || !input["datatype"].is_string() ||
        (input["datatype"] != "INT64" && input["datatype"] != "INT32")) {
      error = "input '" + tensor.name + "' must have datatype INT64 or INT32";
      return std::nullopt;
    }
    const std::size_t width = input["datatype"] == "INT64" ? 8 : 4;
    if (!input.contains("shape") || !input["shape"].is_array()) {
      error = "input '" + tensor.name + "' needs a 'shape' (a list of sizes)";
      return std::nullopt;
    }
    for (const json& d : input["shape"]) {
      // Sizes are non-negative integers (JSON reads them as unsigned); 2^40 bounds each before multiplying.
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40)) {
        error = "input '" + tensor.name + "' has a shape that is not a list of sizes";
        return std::nullopt;
      }
      tensor.shape.push_back(d.get<int64_t>());
    }
    const auto count = element_count(tensor.shape, max_elements);
    if (!count) {
      why = 413;
      error = "input '" + tensor.name + "' has more than " + std::to_string(max_elements) + " elements";
      return std::nullopt;
    }
    const json* binary_size = nullptr;
    if (input.contains("parameters") && input["parameters"].is_object() &&
        input["parameters"].contains("binary_data_size")) {
      binary_size = &input["parameters"]["binary_data_size"];
    }
    if (binary_size != nullptr) {
      if (!binary_size->is_number_unsigned() || binary_size->get<uint64_t>() != *count * width) {
        error = "input '" + tensor.name + "': binary_data_size must be " + std::to_string(*count * width) +
                " bytes (" + std::to_string(*count) + " elements of " + std::to_string(width) + ")";
        return std::nullopt;
      }
      if (binary.size() < *count * width) {
        error = "input '" + tensor.name + "': the body holds fewer binary bytes than binary_data_size";
        return std::nullopt;
      }
      tensor.values.resize(*count);
      if (width == 8) {
        if (*count > 0) {  // no memcpy of nothing: an empty vector's data() may be null (UB even for 0 bytes)
          std::memcpy(tensor.values.data(), binary.data(), *count * 8);
        }
      } else {
        for (std::size_t i = 0; i < *count; ++i) {
          int32_t v;
          std::memcpy(&v, binary.data() + 4 * i, 4);
          tensor.values[i] = v;
        }
      }
      binary.remove_prefix(*count * width);
    } else {
      if (!input.contains("data") || !input["data"].is_array()) {
        error = "input '" + tensor.name + "' needs 'data' (a list) or parameters.binary_data_size";
        return std::nullopt;
      }
      tensor.values.reserve(*count);
      if (!flatten_integers(input["data"], *count, tensor.values, error, why)) return std::nullopt;
      if (tensor.values.size() != *count) {
        error = "input '" + tensor.name + "' has " + std::to_string(tensor.values.size()) +
                " elements of data for a shape of " + std::to_string(*count);
        return std::nullopt;
      }
      if (width == 4 && std::any_of(tensor.values.begin(), tensor.values.end(), [](int64_t v) {
            return v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max();
          })) {
        error = "input '" + tensor.name + "' is INT32 but holds values outside its range";
        return std::nullopt;
      }
    }
    out.inputs.push_back(std::move(tensor));
  }
  if (!binary.empty()) {
    error = "the body holds " + std::to_string(binary.size()) + " bytes that no input's binary_data_size claims";
    return std::nullopt;
  }
  out.binary_output = truthy_parameter(request, "binary_data_output");
  if (request.contains("outputs")) {
    const json& outputs = request["outputs"];
    if (!outputs.is_array() || outputs.size() > 1 || (outputs.size() == 1 && (!outputs[0].is_object() ||
                                                                              !outputs[0].contains("name") ||
                                                                              !outputs[0]["name"].is_string()))) {
      error = "'outputs' must be a list of at most one output, by name";
      return std::nullopt;
    }
    if (outputs.size() == 1) {
      out.requested_output = outputs[0]["name"].get<std::string>();
      out.binary_output = truthy_parameter(outputs[0], "binary_data");
    }
  }
  return out;
}

HttpResponse error_answer(int status, const std::string& message) {
  return {status, "application/json", {}, json{{"error", message}}.dump()};
}

HttpResponse infer_answer(const std::string& model, const InferRequest& request, const std::string& output,
                          const std::vector<int64_t>& shape, const float* data) {
  std::size_t count = 1;
  for (const int64_t d : shape) count *= static_cast<std::size_t>(d);
  json answer{{"model_name", model}, {"model_version", "1"}};
  if (!request.id.empty()) answer["id"] = request.id;
  json tensor{{"name", output}, {"datatype", "FP32"}, {"shape", shape}};
  if (request.binary_output) {
    tensor["parameters"] = {{"binary_data_size", count * sizeof(float)}};
    answer["outputs"] = json::array({std::move(tensor)});
    std::string header = answer.dump();
    HttpResponse response{200, "application/octet-stream",
                          {{"Inference-Header-Content-Length", std::to_string(header.size())}}, std::move(header)};
    response.body.append(reinterpret_cast<const char*>(data), count * sizeof(float));
    return response;
  }
  if (!std::all_of(data, data + count, [](float v) { return std::isfinite(v); })) {
    return error_answer(500, "the output holds infinity or NaN, which JSON cannot carry: ask for it in binary "
                            "(parameters.binary_data)");
  }
  // The data written straight into the text (append_json_floats), the rest by nlohmann: {..., "outputs": [{...,
  // "data": [...]}]}.
  std::string text = answer.dump();
  text.pop_back();
  text += ",\"outputs\":[";
  text += tensor.dump();
  text.pop_back();
  text += ",\"data\":[";
  append_json_floats(text, data, count);
  text += "]}]}";
  return {200, "application/json", {}, std::move(text)};
}

}  // namespace speedtorch::serving

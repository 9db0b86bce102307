// Tests for the Open Inference Protocol layer: requests as JSON tensors (flat or nested data) and with binary
// tensors (INT64, INT32), answers in both forms, and the refusals of requests whose sizes do not add up.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "inference_protocol.h"

namespace speedtorch::serving {
namespace {

using nlohmann::json;

std::optional<InferRequest> parse(const std::string& body, std::optional<std::size_t> header, std::string& error) {
  return parse_infer_request(body, header, 1000, error);
}

template <typename T>
std::string bytes_of(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

TEST(InferenceProtocol, ReadsJsonTensorsFlatOrNested) {
  std::string error;
  const auto flat = parse(R"({"id": "r1", "inputs": [{"name": "ids", "shape": [3], "datatype": "INT64",
                                "data": [4, 5, 6]}]})", std::nullopt, error);
  ASSERT_TRUE(flat) << error;
  EXPECT_EQ(flat->id, "r1");
  EXPECT_EQ(flat->inputs[0].values, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_FALSE(flat->binary_output);
  const auto nested = parse(R"({"inputs": [{"name": "ids", "shape": [2, 2], "datatype": "INT32",
                                  "data": [[1, 2], [3, 4]]}], "parameters": {"binary_data_output": true}})",
                            std::nullopt, error);
  ASSERT_TRUE(nested) << error;
  EXPECT_EQ(nested->inputs[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(nested->inputs[0].values, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_TRUE(nested->binary_output);
}

TEST(InferenceProtocol, ReadsBinaryTensorsAfterTheHeader) {
  const std::string header = R"({"inputs": [{"name": "users", "shape": [2], "datatype": "INT64",
      "parameters": {"binary_data_size": 16}}, {"name": "items", "shape": [2], "datatype": "INT32",
      "parameters": {"binary_data_size": 8}}], "outputs": [{"name": "scores", "parameters": {"binary_data": true}}]})";
  const std::string body = header + bytes_of<int64_t>({7, 1ll << 40}) + bytes_of<int32_t>({-3, 9});
  std::string error;
  const auto r = parse(body, header.size(), error);
  ASSERT_TRUE(r) << error;
  EXPECT_EQ(r->inputs[0].values, (std::vector<int64_t>{7, 1ll << 40}));
  EXPECT_EQ(r->inputs[1].values, (std::vector<int64_t>{-3, 9}));
  EXPECT_EQ(r->requested_output, "scores");
  EXPECT_TRUE(r->binary_output);
  // Sizes that do not add up are refused.
  EXPECT_FALSE(parse(body.substr(0, body.size() - 1), header.size(), error));  // a byte short
  EXPECT_FALSE(parse(body + "x", header.size(), error));                       // a byte no input claims
  EXPECT_NE(error.find("no input's binary_data_size claims"), std::string::npos) << error;
  EXPECT_FALSE(parse(body, body.size() + 1, error));
}

TEST(InferenceProtocol, RefusesInputsItCannotTake) {
  std::string error;
  const auto refused = [&](const std::string& inputs) {
    return !parse("{\"inputs\": " + inputs + "}", std::nullopt, error);
  };
  EXPECT_TRUE(refused("[]"));
  EXPECT_TRUE(refused(R"([{"name": "ids", "shape": [2], "datatype": "FP32", "data": [1, 2]}])"));
  EXPECT_TRUE(refused(R"([{"name": "ids", "shape": [3], "datatype": "INT64", "data": [1, 2]}])"));
  EXPECT_TRUE(refused(R"([{"name": "ids", "shape": [1], "datatype": "INT64", "data": [1, 2]}])"));
  EXPECT_TRUE(refused(R"([{"name": "ids", "shape": [1], "datatype": "INT64", "data": [1.5]}])"));
  EXPECT_TRUE(refused(R"([{"name": "ids", "shape": [1], "datatype": "INT64", "data": [18446744073709551615]}])"));
  EXPECT_TRUE(refused(R"([{"name": "ids", "shape": [1], "datatype": "INT32", "data": [4294967296]}])"));
  EXPECT_TRUE(refused(R"([{"name": "ids", "shape": [-1], "datatype": "INT64", "data": []}])"));
  // Shapes whose product overflows, or passes the element limit, are refused before anything is allocated.
  EXPECT_TRUE(refused(R"([{"name": "ids", "shape": [1099511627776, 1099511627776], "datatype": "INT64",
                          "parameters": {"binary_data_size": 0}}])"));
  EXPECT_TRUE(refused(R"([{"name": "ids", "shape": [1001], "datatype": "INT64", "data": []}])"));
  EXPECT_NE(error.find("more than 1000 elements"), std::string::npos) << error;
  std::string length_error;
  std::optional<std::size_t> length;
  const std::string text = "12x";
  EXPECT_FALSE(read_inference_header_length(&text, 100, length, length_error));
  const std::string big = "101";
  EXPECT_FALSE(read_inference_header_length(&big, 100, length, length_error));
  EXPECT_TRUE(read_inference_header_length(nullptr, 100, length, length_error));
  EXPECT_FALSE(length);
}

TEST(InferenceProtocol, AnswersInJsonOrBinary) {
  InferRequest request;
  request.id = "abc";
  const std::vector<float> rows = {0.5f, -1.25f, 3.0f, 4.0f};
  const HttpResponse as_json = infer_answer("lookup", request, "rows", {2, 2}, rows.data());
  EXPECT_EQ(as_json.status, 200);
  const json j = json::parse(as_json.body);
  EXPECT_EQ(j["id"], "abc");
  EXPECT_EQ(j["outputs"][0]["shape"], json::array({2, 2}));
  EXPECT_EQ(j["outputs"][0]["data"].get<std::vector<float>>(), rows);
  request.binary_output = true;
  const HttpResponse binary = infer_answer("lookup", request, "rows", {2, 2}, rows.data());
  ASSERT_EQ(binary.headers.size(), 1u);
  EXPECT_EQ(binary.headers[0].first, "Inference-Header-Content-Length");
  const std::size_t length = std::stoul(binary.headers[0].second);
  EXPECT_EQ(json::parse(binary.body.substr(0, length))["outputs"][0]["parameters"]["binary_data_size"], 16);
  ASSERT_EQ(binary.body.size(), length + 16);
  EXPECT_EQ(std::memcmp(binary.body.data() + length, rows.data(), 16), 0);
  // Infinity goes out in binary, and is refused in JSON rather than written as null.
  const std::vector<float> odd = {std::numeric_limits<float>::infinity()};
  EXPECT_EQ(infer_answer("score", request, "scores", {1}, odd.data()).status, 200);
  request.binary_output = false;
  EXPECT_EQ(infer_answer("score", request, "scores", {1}, odd.data()).status, 500);
}

}  // namespace
}  // namespace speedtorch::serving

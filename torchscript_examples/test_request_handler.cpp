// Tests for request_handler (the server's JSON layer) over a recommender module built in C++ with
// torch::jit::Module::define: the same methods as recommender_model.py, a PinnedEmbedding attribute included.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/custom_class.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "embedding/pinned_embedding.h"
#include "request_handler.h"
#include "request_json.h"

namespace speedtorch::serving {
namespace {

using nlohmann::json;

// lookup_work > 0: lookup also multiplies a 256 x 256 matrix that many times (~2 ms each), work that changes
// nothing in its answer but keeps the service's read lock held.
torch::jit::Module make_model(int64_t users, int64_t items, int64_t dim, int lookup_work = 0) {
  torch::jit::Module m("Recommender");
  auto table = torch::make_custom_class<PinnedEmbedding>(users, dim, at::kFloat);
  table.toCustomClass<PinnedEmbedding>()->normal_(0.0, 1.0, 3);
  m.register_attribute("users", c10::getCustomClassType<c10::intrusive_ptr<PinnedEmbedding>>(), table);
  m.register_parameter("items", torch::randn({items, dim}), false);
  m.register_parameter("bias", torch::zeros({1}), false);
  m.register_parameter("work", torch::randn({256, 256}) / 16, false);
  const std::string lookup = lookup_work == 0 ? R"(
    def lookup(self, ids: Tensor) -> Tensor:
        return self.users.gather(ids, None)
  )" : R"(
    def lookup(self, ids: Tensor) -> Tensor:
        h = self.work
        for _ in range()" + std::to_string(lookup_work) + R"():
            h = torch.tanh(h @ self.work)
        return self.users.gather(ids, None) + 0.0 * h.sum()
  )";
  m.define(lookup);
  m.define(R"(
    def num_users(self) -> int:
        return self.users.num_rows()
    def score(self, users: Tensor, items: Tensor) -> Tensor:
        return (self.users.gather(users, None) * self.items[items]).sum(-1) + self.bias
    def top_k(self, user: int, k: int) -> Tuple[Tensor, Tensor]:
        row = self.users.gather(torch.tensor([user], device=self.items.device), None)[0]
        top = torch.topk(self.items @ row + self.bias, k)
        return top.indices, top.values
    def update_rows(self, ids: Tensor, rows: Tensor) -> None:
        self.users.scatter_(ids, rows)
  )");
  return m;
}

TEST(RequestHandler, LookupMatchesTheTable) {
  torch::jit::Module model = make_model(50, 10, 4);
  const at::Tensor table = model.attr("users").toCustomClass<PinnedEmbedding>()->table();
  RecommenderService service(model, 100);
  const Response r = service.lookup(R"({"ids": [3, 49, 3]})");
  ASSERT_EQ(r.status, 200) << r.body;
  const auto rows = json::parse(r.body)["rows"].get<std::vector<std::vector<float>>>();
  ASSERT_EQ(rows.size(), 3u);
  for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(rows[1][j], table[49][j].item<float>());
}

// Answers write each float as the shortest text of its double value (std::to_chars): read as doubles it is the
// float32 value exactly, bit for bit, for ordinary, tiny (subnormal), huge and negative-zero values alike.
TEST(RequestHandler, AnswersReadBackAsTheSameFloats) {
  torch::jit::Module model = make_model(8, 3, 16);
  const at::Tensor table = model.attr("users").toCustomClass<PinnedEmbedding>()->table();
  table[0].copy_(torch::tensor({1e-40f, -1e-45f, 3.4028235e38f, -0.0f, 0.1f, 1.0f / 3, 16777217.0f, -2.5f, 1e-7f,
                                123456.789f, 7e-39f, 0.3f, -0.7f, 1e10f, 5e-324f, 2.0f}));
  RecommenderService service(model, 8);
  const Response r = service.lookup(R"({"ids": [0, 5]})");
  ASSERT_EQ(r.status, 200) << r.body;
  const auto rows = json::parse(r.body)["rows"].get<std::vector<std::vector<double>>>();
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t id = i == 0 ? 0 : 5;
    for (int64_t j = 0; j < 16; ++j) {
      const double want = table[id][j].item<float>();
      EXPECT_EQ(std::memcmp(&rows[i][j], &want, 8), 0) << id << "," << j << ": " << rows[i][j] << " vs " << want;
    }
  }
}

TEST(RequestHandler, TopKAndScoreAgree) {
  RecommenderService service(make_model(20, 30, 8), 100);
  const json top = json::parse(service.top_k(R"({"user": 7, "k": 5})").body);
  ASSERT_EQ(top["items"].size(), 5u);
  json request{{"users", {7}}, {"items", {top["items"][0]}}};
  const json scored = json::parse(service.score(request.dump()).body);
  EXPECT_NEAR(scored["scores"][0].get<float>(), top["scores"][0].get<float>(), 1e-5);
}

// The same answers from a model whose dense parameters are on the GPU (the table stays in pinned host memory).
TEST(RequestHandler, AnswersFromAGpuModelMatchTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::jit::Module model = make_model(40, 30, 8);
  const RecommenderService on_cpu(model.clone(), 100);
  torch::jit::Module gpu_model = model.clone();
  gpu_model.to(torch::kCUDA);
  const RecommenderService on_gpu(gpu_model, 100, torch::kCUDA);
  for (const char* request : {R"({"user": 7, "k": 5})", R"({"user": 39, "k": 30})"}) {
    const json a = json::parse(on_cpu.top_k(request).body);
    const Response r = on_gpu.top_k(request);
    ASSERT_EQ(r.status, 200) << r.body;
    const json b = json::parse(r.body);
    EXPECT_EQ(a["items"], b["items"]);
  }
  const char* scores = R"({"users": [1, 2, 39], "items": [0, 29, 5]})";
  const auto sa = json::parse(on_cpu.score(scores).body)["scores"].get<std::vector<float>>();
  const auto sb = json::parse(on_gpu.score(scores).body)["scores"].get<std::vector<float>>();
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) EXPECT_NEAR(sa[i], sb[i], 1e-4);
  EXPECT_EQ(json::parse(on_cpu.lookup(R"({"ids": [5]})").body), json::parse(on_gpu.lookup(R"({"ids": [5]})").body));
}

TEST(RequestHandler, BadRequestsGetFourHundreds) {
  RecommenderService service(make_model(20, 30, 4), 8);
  EXPECT_EQ(service.lookup("{not json").status, 400);
  EXPECT_EQ(service.lookup("[1, 2]").status, 400);
  EXPECT_EQ(service.lookup(R"({"ids": []})").status, 400);
  EXPECT_EQ(service.lookup(R"({"ids": [1, "x"]})").status, 400);
  EXPECT_EQ(service.lookup(R"({"ids": [1, 20]})").status, 404);
  EXPECT_EQ(service.lookup(R"({"ids": [-1]})").status, 404);
  EXPECT_EQ(service.lookup(R"({"ids": [1,1,1,1,1,1,1,1,1]})").status, 413);
  EXPECT_EQ(service.top_k(R"({"user": 3, "k": 0})").status, 400);
  EXPECT_EQ(service.top_k(R"({"user": 99, "k": 2})").status, 404);
  EXPECT_EQ(service.score(R"({"users": [1, 2], "items": [3]})").status, 400);
  EXPECT_EQ(service.update(R"({"ids": [1], "rows": [[1, 2]]})").status, 400);
  const Response bad = service.lookup(R"({"ids": [1, 20]})");
  EXPECT_NE(bad.body.find("unknown id 20"), std::string::npos) << bad.body;
}

// 140 KB of nested lists killed the server (SIGSEGV: the error message dumped the value recursively). Refused
// with a 400 before parsing, in every field, however deep.
TEST(RequestHandler, DeeplyNestedJsonIsRefusedNotACrash) {
  RecommenderService service(make_model(20, 30, 4), 8);
  const auto nested = [](int depth) { return std::string(depth, '[') + "1" + std::string(depth, ']'); };
  for (const int depth : {33, 70000, 1000000}) {
    const Response ids = service.lookup(R"({"ids": )" + nested(depth) + "}");
    EXPECT_EQ(ids.status, 400) << ids.body;
    EXPECT_NE(ids.body.find("deeper than 32"), std::string::npos) << ids.body;
    EXPECT_EQ(service.score(R"({"users": )" + nested(depth) + R"(, "items": [1]})").status, 400);
    EXPECT_EQ(service.top_k(R"({"user": )" + nested(depth) + R"(, "k": 1})").status, 400);
    EXPECT_EQ(service.update(R"({"ids": [1], "rows": [[1, 2, 3, )" + nested(depth) + "]]}").status, 400);
    EXPECT_EQ(service.lookup(std::string(depth, '{')).status, 400);
  }
  // Brackets inside strings do not count; a list at the limit still gets the ordinary answer for its content.
  EXPECT_EQ(service.lookup(R"({"ids": [1], "note": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"[["})").status, 200);
  const Response shallow = service.lookup(R"({"ids": )" + nested(30) + "}");
  EXPECT_EQ(shallow.status, 400);
  EXPECT_NE(shallow.body.find("got a list of 1 values"), std::string::npos) << shallow.body;
}

// A body of many small values is refused before it is parsed: parsed, each value costs 16 to 110 bytes of memory
// for its 2 or 3 bytes of text (64 MiB of [{},{},...] took 2.3 GB). Commas and brackets inside strings do not count.
TEST(RequestHandler, BodiesOfTooManyValuesAreRefusedBeforeParsing) {
  RecommenderService service(make_model(20, 30, 4), 8);
  const auto many = [](int64_t n, const std::string& value) {
    std::string list = "[";
    for (int64_t i = 0; i < n; ++i) list += (i ? "," : "") + value;
    return list + "]";
  };
  for (const std::string value : {"1", "{}", "[]"}) {
    const Response r = service.lookup(R"({"ids": )" + many(kMaxJsonValues + 1, value) + "}");
    EXPECT_EQ(r.status, 400) << value;
    EXPECT_NE(r.body.find("more than 1048576 values"), std::string::npos) << r.body;
  }
  // 1 + the object and the list opened + 3 commas; the string's commas and brackets are text.
  EXPECT_EQ(json_extent(R"({"ids": [1, 2, 3], "note": ",,,[[{"})").values, 6);
  EXPECT_EQ(json_extent(many(1000, "[1,2]")).values, 1 + 1 + 999 + 1000 + 1000);
  EXPECT_EQ(service.lookup(R"({"ids": [1, 2], "note": ",,,,,,,,,,"})").status, 200);
}

// 1e39 would be written as infinity; numbers beyond float32 are refused, the row keeps its value.
TEST(RequestHandler, UpdateRefusesNumbersOutsideFloat32) {
  torch::jit::Module model = make_model(20, 30, 2);
  const at::Tensor table = model.attr("users").toCustomClass<PinnedEmbedding>()->table();
  RecommenderService service(model, 8);
  const float before = table[3][0].item<float>();
  for (const char* big : {"1e39", "-1e39", "3.4028236e38"}) {
    const Response r = service.update(std::string(R"({"ids": [3], "rows": [[)") + big + ", 0]]}");
    EXPECT_EQ(r.status, 400) << big << ": " << r.body;
    EXPECT_NE(r.body.find("float32 range"), std::string::npos) << r.body;
  }
  EXPECT_EQ(service.update(R"({"ids": [3], "rows": [[1e400, 0]]})").status, 400);  // beyond double: not JSON
  EXPECT_EQ(table[3][0].item<float>(), before);
  EXPECT_EQ(service.update(R"({"ids": [3], "rows": [[3.4028234e38, -1e-50]]})").status, 200);
  EXPECT_EQ(table[3][0].item<float>(), 3.4028234e38f);
}

// A model that declares a serving format (quantized_recommender.py) serves a read-only copy: /update is a 409 that
// says why, before the model is called, and reads go on; a PinnedEmbedding model reports its table's dtype.
TEST(RequestHandler, AServingCopyRefusesUpdatesAndStillServes) {
  torch::jit::Module model = make_model(20, 5, 2);
  EXPECT_EQ(RecommenderService(model, 8).table_format(), "float32");
  model.register_attribute("table_format", c10::StringType::get(), std::string("int8_rowwise"));
  const at::Tensor table = model.attr("users").toCustomClass<PinnedEmbedding>()->table();
  const at::Tensor before = table.clone();
  RecommenderService service(model, 8);
  EXPECT_EQ(service.table_format(), "int8_rowwise");
  const Response r = service.update(R"({"ids": [3], "rows": [[1, 2]]})");
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_NE(r.body.find("read-only int8_rowwise serving copy"), std::string::npos) << r.body;
  EXPECT_TRUE(torch::equal(table, before));
  EXPECT_EQ(service.lookup(R"({"ids": [3]})").status, 200);
}

// The server needs a model's methods, not a PinnedEmbedding: a model keeping its rows in a tensor (no `users`
// attribute) was refused once /health named the table's format ("Tried to cast IValue to custom class").
TEST(RequestHandler, AModelWithoutAPinnedEmbeddingServesWithAnUnknownFormat) {
  torch::jit::Module m("Recommender");
  const at::Tensor rows = torch::randn({20, 3});
  m.register_parameter("rows", rows, false);
  m.register_parameter("items", torch::randn({5, 3}), false);
  m.define(R"(
    def num_users(self) -> int:
        return self.rows.size(0)
    def lookup(self, ids: Tensor) -> Tensor:
        return self.rows[ids]
    def score(self, users: Tensor, items: Tensor) -> Tensor:
        return (self.rows[users] * self.items[items]).sum(-1)
    def top_k(self, user: int, k: int) -> Tuple[Tensor, Tensor]:
        top = torch.topk(self.items @ self.rows[user], k)
        return top.indices, top.values
    def update_rows(self, ids: Tensor, rows: Tensor) -> None:
        self.rows[ids] = rows
  )");
  RecommenderService service(m, 8);
  EXPECT_EQ(service.table_format(), "unknown");
  const Response r = service.lookup(R"({"ids": [4]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["rows"][0][1].get<float>(), rows[4][1].item<float>());
  EXPECT_EQ(service.update(R"({"ids": [4], "rows": [[1, 2, 3]]})").status, 200);
  EXPECT_EQ(rows[4][2].item<float>(), 3.0f);
}

// Ids above INT64_MAX were read as negative ("unknown id -1"): the answer names the id that was sent.
TEST(RequestHandler, HugeUnsignedIdsAreNamedAsSent) {
  RecommenderService service(make_model(20, 30, 2), 8);
  for (const char* id : {"9223372036854775808", "18446744073709551615"}) {
    const Response r = service.lookup(std::string(R"({"ids": [1, )") + id + "]}");
    EXPECT_EQ(r.status, 404);
    EXPECT_NE(r.body.find(std::string("unknown id ") + id + " in 'ids'"), std::string::npos) << r.body;
    const Response top = service.top_k(std::string(R"({"user": )") + id + R"(, "k": 1})");
    EXPECT_EQ(top.status, 404);
    EXPECT_NE(top.body.find(std::string("unknown id ") + id), std::string::npos) << top.body;
    EXPECT_EQ(service.top_k(std::string(R"({"user": 1, "k": )") + id + "}").status, 400);
  }
}

// JSON cannot carry infinity or NaN (nlohmann writes null): a row or score holding one is an error, not a null.
TEST(RequestHandler, NonFiniteAnswersAreAnErrorNotNull) {
  torch::jit::Module model = make_model(20, 30, 2);
  const at::Tensor table = model.attr("users").toCustomClass<PinnedEmbedding>()->table();
  table[4][1] = std::numeric_limits<float>::infinity();
  table[5][0] = std::numeric_limits<float>::quiet_NaN();
  RecommenderService service(model, 8);
  for (const char* ids : {R"({"ids": [4]})", R"({"ids": [1, 5]})"}) {
    const Response r = service.lookup(ids);
    EXPECT_EQ(r.status, 500) << r.body;
    EXPECT_NE(r.body.find("infinity or NaN"), std::string::npos) << r.body;
  }
  EXPECT_EQ(service.score(R"({"users": [4], "items": [0]})").status, 500);
  EXPECT_EQ(service.top_k(R"({"user": 5, "k": 3})").status, 500);
  EXPECT_EQ(service.lookup(R"({"ids": [1, 2]})").status, 200);
}

TEST(RequestHandler, UpdatesAreWholeRowsUnderConcurrentReads) {
  RecommenderService service(make_model(16, 4, 64), 64);
  json start{{"ids", {5}}, {"rows", {std::vector<float>(64, 0.0f)}}};
  ASSERT_EQ(service.update(start.dump()).status, 200);  // from here on row 5 is always constant
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      while (!done) {
        const auto rows = json::parse(service.lookup(R"({"ids": [5]})").body)["rows"][0].get<std::vector<float>>();
        for (float v : rows) {
          if (v != rows[0]) ++torn;  // a mix of two updates
        }
      }
    });
  }
  for (int i = 1; i <= 200; ++i) {
    json request{{"ids", {5}}, {"rows", {std::vector<float>(64, static_cast<float>(i))}}};
    ASSERT_EQ(service.update(request.dump()).status, 200);
  }
  done = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(torn.load(), 0);
  const auto last = json::parse(service.lookup(R"({"ids": [5]})").body)["rows"][0].get<std::vector<float>>();
  EXPECT_EQ(last[63], 200.0f);
}

// A stream of overlapping lookups must not hold an update back. With a reader-preferring lock (glibc's
// std::shared_mutex) the update waits until the readers stop on their own, after 20 s; with the server's
// writer-preferring TableLock it goes in once the reads in progress finish, and the reads then go on.
TEST(RequestHandler, AnUpdateGetsInWhileLookupsKeepComing) {
  RecommenderService service(make_model(16, 4, 8, /*lookup_work=*/10), 64);
  const auto give_up_at = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::atomic<bool> updated{false};
  std::atomic<bool> readers_gave_up{false};
  std::atomic<int> reads{0};
  std::atomic<int> reads_after_update{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      // Until the update is in, and for a few reads after it (reads keep coming through).
      while (reads_after_update.load() < 8) {
        if (!updated.load() && std::chrono::steady_clock::now() > give_up_at) {
          readers_gave_up = true;  // the update never got in while we read: let it in, and fail below
          return;
        }
        ASSERT_EQ(service.lookup(R"({"ids": [5]})").status, 200);
        ++reads;
        if (updated.load()) ++reads_after_update;
      }
    });
  }
  while (reads.load() < 8) std::this_thread::yield();  // the readers are in their stride
  json request{{"ids", {5}}, {"rows", {std::vector<float>(8, 1.0f)}}};
  ASSERT_EQ(service.update(request.dump()).status, 200);
  updated = true;
  for (auto& t : readers) t.join();
  EXPECT_FALSE(readers_gave_up.load()) << "the update waited until the readers stopped";
  EXPECT_GE(reads_after_update.load(), 8);
}

}  // namespace
}  // namespace speedtorch::serving

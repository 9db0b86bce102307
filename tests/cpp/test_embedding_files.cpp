// Tests for csrc/io/embedding_files (a table, its optimizer state and meta on disk) and csrc/io/json_value.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "error_text.h"
#include "io/embedding_files.h"
#include "io/json_value.h"
#include "io/npy_file.h"
#include "temp_dir.h"

namespace speedtorch::io {
namespace {

using speedtorch::testing::error_of;

class EmbeddingFiles : public speedtorch::testing::TempDirTest {
 protected:
  c10::Dict<std::string, double> options() const {
    c10::Dict<std::string, double> o;
    o.insert("lr", 0.05);
    o.insert("beta2", 0.99);
    return o;
  }
};

TEST(JsonValue, RoundTripsWhatMetaFilesHold) {
  JsonValue obj = JsonValue::object();
  obj.set("name", JsonValue::of(std::string("a \"quoted\" \\ name\n")));
  obj.set("lr", JsonValue::of(0.1));
  obj.set("big", JsonValue::of(9007199254740991.0));
  obj.set("inf", JsonValue::of(HUGE_VAL));
  JsonValue inner = JsonValue::object();
  inner.set("x", JsonValue::of(-1.5e-300));
  obj.set("inner", std::move(inner));
  const std::string text = to_json(obj);
  EXPECT_NE(text.find("\"lr\": 0.1,"), std::string::npos);  // shortest exact form
  const JsonValue back = parse_json(text, "t.json");
  EXPECT_EQ(back.find("name")->text, "a \"quoted\" \\ name\n");
  EXPECT_EQ(back.find("lr")->number, 0.1);
  EXPECT_EQ(back.find("big")->number, 9007199254740991.0);
  EXPECT_TRUE(std::isinf(back.find("inf")->number));
  EXPECT_EQ(back.find("inner")->find("x")->number, -1.5e-300);
  EXPECT_EQ(back.find("missing"), nullptr);
  const JsonValue py = parse_json("{\"a\": true, \"b\": false, \"c\": null, \"d\": NaN, \"e\": \"\\u00e9\"}", "p");
  EXPECT_TRUE(py.find("a")->boolean);
  EXPECT_FALSE(py.find("b")->boolean);
  EXPECT_TRUE(std::isnan(py.find("d")->number));
  EXPECT_EQ(py.find("e")->text, "\xc3\xa9");
  EXPECT_NE(error_of([] { parse_json("{\"a\": 1,", "m.json"); }).find("m.json is not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { parse_json("{\"a\": [1]}", "m.json"); }).find("arrays"), std::string::npos);
}

TEST_F(EmbeddingFiles, SaveAndLoadTableStateAndMeta) {
  const at::Tensor records = at::randn({300, 40});
  const at::Tensor table = records.narrow(1, 0, 8).to(at::kBFloat16);  // dense bf16
  const at::Tensor state = at::randn({300, 20});
  const EmbeddingMeta saved = save_embedding_files(path("users.npy"), table, state, "adam", options(), 17, true);
  EXPECT_EQ(saved.table_hash.size(), 16u);
  EXPECT_EQ(file_count(), 3u);
  const EmbeddingMeta meta = read_embedding_meta(path("users"));  // with or without the .npy suffix
  EXPECT_EQ(meta.num_rows, 300);
  EXPECT_EQ(meta.dim, 8);
  EXPECT_EQ(meta.dtype, at::kBFloat16);
  EXPECT_EQ(meta.optimizer, "adam");
  EXPECT_EQ(meta.options.at("lr"), 0.05);
  EXPECT_EQ(meta.options.at("beta2"), 0.99);
  EXPECT_EQ(meta.step, 17);
  EXPECT_EQ(meta.state_width, 20);
  EXPECT_EQ(meta.table_hash, saved.table_hash);
  at::Tensor t = at::empty({300, 8}, at::kBFloat16);
  // A strided destination (state beside rows) is filled through staging.
  at::Tensor s_records = at::full({300, 24}, 3.0);
  at::Tensor s = s_records.narrow(1, 4, 20);
  load_embedding_files(path("users.npy"), meta, t, s, true);
  EXPECT_TRUE(at::equal(t, table));
  EXPECT_TRUE(at::equal(s, state));
  EXPECT_TRUE(at::equal(s_records.narrow(1, 0, 4), at::full({300, 4}, 3.0)));
}

// What single bit flips in meta files turned into (tests/python/test_reliability.py): numbers JSON does not allow,
// which strtod or from_chars would still read, and a NUL read as white space.
TEST(JsonValue, RejectsWhatJsonDoesNotAllow) {
  for (const std::string bad : {"{\"a\": 01}", "{\"a\": .5}", "{\"a\": 1.}", "{\"a\": +1}", "{\"a\": 1e}",
                                "{\"a\": inf}", "{\"a\": 0x10}"}) {
    EXPECT_NE(error_of([&] { parse_json(bad, "m.json"); }).find("m.json is not valid JSON"), std::string::npos) << bad;
  }
  EXPECT_NE(error_of([&] { parse_json(std::string("{\"a\":\0 1}", 9), "m.json"); }).find("not valid JSON"),
            std::string::npos);
  const JsonValue ok = parse_json("{\"a\": -0.5e-3, \"b\": 0, \"c\": 10E+2}", "m.json");
  EXPECT_EQ(ok.find("a")->number, -0.5e-3);
  EXPECT_EQ(ok.find("b")->number, 0.0);
  EXPECT_EQ(ok.find("c")->number, 1000.0);
}

TEST_F(EmbeddingFiles, FilesFromDifferentSavesAreAnError) {
  const at::Tensor table = at::randn({64, 4});
  save_embedding_files(path("a.npy"), table, at::randn({64, 8}), "adagrad", options(), 1, false);
  // Another checkpoint of the same shape: its state replaces a's (as a crash between renames would leave it).
  save_embedding_files(path("b.npy"), table, at::randn({64, 8}), "adagrad", options(), 2, false);
  ASSERT_EQ(::rename(path("b.state.npy").c_str(), path("a.state.npy").c_str()), 0);
  const EmbeddingMeta meta = read_embedding_meta(path("a.npy"));
  at::Tensor t = at::empty({64, 4});
  at::Tensor s = at::empty({64, 8});
  const std::string err = error_of([&] { load_embedding_files(path("a.npy"), meta, t, s, true); });
  EXPECT_NE(err.find("a.state.npy does not match"), std::string::npos) << err;
  EXPECT_NE(err.find("different saves"), std::string::npos);
  load_embedding_files(path("a.npy"), meta, t, s, /*verify=*/false);  // accepted as it is on request
  EXPECT_TRUE(at::equal(t, table));
}

// The meta file carries a hash of its own members: a damaged value (the learning rate, the step count) is an error
// rather than a table that trains differently; a meta file without the hash (an older save) still loads.
TEST_F(EmbeddingFiles, DamagedMetaValuesAreAnError) {
  save_embedding_files(path("m.npy"), at::randn({10, 4}), at::randn({10, 8}), "adagrad", options(), 3, false);
  const std::string text = read_bytes(path("m.meta.json"));
  const EmbeddingMeta good = read_embedding_meta(path("m.npy"));
  std::string lr = text;
  const std::size_t at_lr = lr.find("\"lr\": ");
  ASSERT_NE(at_lr, std::string::npos);
  lr[at_lr + 6] ^= 0x01;  // the learning rate's first digit
  write_bytes(path("m.meta.json"), lr);
  EXPECT_NE(error_of([&] { read_embedding_meta(path("m.npy")); }).find("does not match its \"meta_hash\""),
            std::string::npos);
  std::string step = text;
  step.replace(step.find("\"step\": 3"), 9, "\"step\": 2");
  write_bytes(path("m.meta.json"), step);
  EXPECT_NE(error_of([&] { read_embedding_meta(path("m.npy")); }).find("is damaged"), std::string::npos);
  // Layout is not content: the same members written on one line still match.
  std::string one_line;
  for (const char c : text) {
    if (c != '\n') one_line.push_back(c);
  }
  write_bytes(path("m.meta.json"), one_line);
  EXPECT_EQ(read_embedding_meta(path("m.npy")).step, 3);
  // Without "meta_hash" (as saves before it): read unchecked.
  std::string old = text;
  const std::size_t line = old.find(",\n  \"meta_hash\"");
  ASSERT_NE(line, std::string::npos);
  old.erase(line, old.find('\n', line + 2) - line);
  write_bytes(path("m.meta.json"), old);
  EXPECT_EQ(read_embedding_meta(path("m.npy")).table_hash, good.table_hash);
}

TEST_F(EmbeddingFiles, MissingOrMismatchedFilesAreClearErrors) {
  save_embedding_files(path("u.npy"), at::randn({10, 4}), at::randn({10, 8}), "adam", options(), 3, true);
  save_npy(at::randn({11, 4}), path("u.npy"));  // rows of another table
  EXPECT_NE(error_of([&] { read_embedding_meta(path("u.npy")); }).find("describes a 10 x 4 table"),
            std::string::npos);
  save_npy(at::randn({10, 4}).to(at::kHalf), path("u.npy"));
  EXPECT_NE(error_of([&] { read_embedding_meta(path("u.npy")); }).find("describes a float32 table"),
            std::string::npos);
  ::unlink(path("u.state.npy").c_str());
  save_npy(at::randn({10, 4}), path("u.npy"));
  EXPECT_NE(error_of([&] { read_embedding_meta(path("u.npy")); }).find("optimizer state file"), std::string::npos);
  write_bytes(path("u.meta.json"), "{\"format\": \"speedtorch.embedding\", \"version\": 2}");
  EXPECT_NE(error_of([&] { read_embedding_meta(path("u.npy")); }).find("format version 2"), std::string::npos);
  write_bytes(path("u.meta.json"), "{\"format\": \"something else\"}");
  EXPECT_NE(error_of([&] { read_embedding_meta(path("u.npy")); }).find("not a speedtorch table"), std::string::npos);
  EXPECT_NE(error_of([&] { read_embedding_meta(path("none.npy")); }).find("no table at"), std::string::npos);
}

TEST_F(EmbeddingFiles, PlainNpyLoadsAsRowsOnly) {
  const at::Tensor rows = at::randn({25, 6}, at::kDouble);
  save_npy(rows, path("plain.npy"));
  const EmbeddingMeta meta = read_embedding_meta(path("plain.npy"));
  EXPECT_FALSE(meta.has_meta_file);
  EXPECT_EQ(meta.dtype, at::kFloat);  // float64 rows become a float32 table
  EXPECT_TRUE(meta.optimizer.empty());
  at::Tensor t = at::empty({25, 6});
  load_embedding_files(path("plain.npy"), meta, t, at::Tensor(), true);
  EXPECT_TRUE(at::allclose(t, rows.to(at::kFloat)));
  save_npy(at::randn({3, 4, 5}), path("cube.npy"));
  EXPECT_NE(error_of([&] { read_embedding_meta(path("cube.npy")); }).find("a table is 2-D"), std::string::npos);
  save_npy(at::randn({3, 4}).to(at::kBFloat16), path("bits.npy"));
  EXPECT_NE(error_of([&] { read_embedding_meta(path("bits.npy")); }).find("is it missing?"), std::string::npos);
}

TEST_F(EmbeddingFiles, SaveWithoutOptimizerRemovesAStaleStateFile) {
  save_embedding_files(path("t.npy"), at::randn({5, 4}), at::randn({5, 8}), "adam", options(), 1, true);
  save_embedding_files(path("t.npy"), at::randn({5, 4}), at::Tensor(), "", c10::Dict<std::string, double>(), 0, true);
  EXPECT_EQ(file_count(), 2u);
  EXPECT_TRUE(read_embedding_meta(path("t.npy")).optimizer.empty());
}

}  // namespace
}  // namespace speedtorch::io

// Tests for csrc/io/embedding_files (a table, its optimizer state and meta on disk) and csrc/io/meta_json.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>

#include "error_text.h"
#include "io/embedding_files.h"
#include "io/meta_json.h"
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

TEST(MetaJson, RoundTripsWhatMetaFilesHold) {
  MetaJson obj = MetaJson::object();
  obj["name"] = "a \"quoted\" \\ name\n";
  obj["lr"] = 0.1;
  obj["big"] = 9007199254740991.0;
  obj["inf"] = HUGE_VAL;
  MetaJson inner = MetaJson::object();
  inner["x"] = -1.5e-300;
  obj["inner"] = std::move(inner);
  const std::string text = to_meta_json(obj);
  EXPECT_NE(text.find("\"lr\": 0.1,"), std::string::npos);  // shortest exact form
  const MetaJson back = parse_meta_json(text, "t.json");
  EXPECT_EQ(back.at("name").get<std::string>(), "a \"quoted\" \\ name\n");
  EXPECT_EQ(back.at("lr").get<double>(), 0.1);
  EXPECT_EQ(back.at("big").get<double>(), 9007199254740991.0);
  EXPECT_TRUE(std::isinf(back.at("inf").get<double>()));
  EXPECT_EQ(back.at("inner").at("x").get<double>(), -1.5e-300);
  EXPECT_EQ(back.find("missing"), back.end());
  EXPECT_EQ(to_meta_json(back), text);
  const MetaJson py = parse_meta_json("{\"a\": true, \"b\": false, \"c\": null, \"d\": NaN, \"e\": \"\\u00e9\"}", "p");
  EXPECT_TRUE(py.at("a").get<bool>());
  EXPECT_FALSE(py.at("b").get<bool>());
  EXPECT_TRUE(py.at("c").is_null());
  EXPECT_TRUE(std::isnan(py.at("d").get<double>()));
  EXPECT_EQ(py.at("e").get<std::string>(), "\xc3\xa9");
  EXPECT_NE(error_of([] { parse_meta_json("{\"a\": 1,", "m.json"); }).find("m.json is not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_meta_json("{\"a\": [1]}", "m.json"); }).find("arrays"), std::string::npos);
}

// What the code before nlohmann-json and xxHash (commit 586863e: its json_value.cpp, content_hash.cpp and
// embedding_files.cpp) wrote for the save below, byte for byte: numbers as std::to_chars's shortest form (1e+05,
// 1e-04, -0), Infinity, a newline in a string as a backslash-u escape; its content hashes and "meta_hash".
const char kMetaOfEarlierVersions[] = R"({
  "format": "speedtorch.embedding",
  "version": 1,
  "num_rows": 1e+05,
  "dim": 1,
  "dtype": "float32",
  "table_file": "g\u000a\"q\".npy",
  "table_hash": "38990bc91bd46478",
  "optimizer": "rprop",
  "options": {
    "lr": 1e-04,
    "step_size_min": -0,
    "step_size_max": Infinity,
    "etaplus": 1.2
  },
  "step": 1e+06,
  "state_file": "g\u000a\"q\".state.npy",
  "state_hash": "38990bc91bd46478",
  "state_width": 1,
  "state_beside_rows": 0,
  "meta_hash": "54e4ebd0b8617a32"
}
)";

TEST_F(EmbeddingFiles, MetaFilesAreWhatEarlierVersionsWroteAndRead) {
  const std::string file = path("g\n\"q\".npy");  // any bytes but '/' and NUL make a file name
  c10::Dict<std::string, double> o;
  o.insert("lr", 1e-4);
  o.insert("step_size_min", -0.0);
  o.insert("step_size_max", HUGE_VAL);
  o.insert("etaplus", 1.2);
  save_embedding_files(file, at::zeros({100000, 1}), at::zeros({100000, 1}), "rprop", o, 1000000, false);
  EXPECT_EQ(read_bytes(path("g\n\"q\".meta.json")), kMetaOfEarlierVersions);
  // The file of the earlier version (the same bytes) reads back: same values, its "meta_hash" matches.
  const EmbeddingMeta meta = read_embedding_meta(file);
  EXPECT_EQ(meta.num_rows, 100000);
  EXPECT_EQ(meta.step, 1000000);
  EXPECT_EQ(meta.options.at("lr"), 1e-4);
  EXPECT_TRUE(std::signbit(meta.options.at("step_size_min")));
  EXPECT_EQ(meta.options.at("step_size_max"), HUGE_VAL);
  at::Tensor t = at::ones({100000, 1});
  at::Tensor s = at::ones({100000, 1});
  load_embedding_files(file, meta, t, s, /*verify=*/true);  // its content hashes match
  EXPECT_TRUE(at::equal(t, at::zeros({100000, 1})));
  EXPECT_EQ(to_meta_json(parse_meta_json(kMetaOfEarlierVersions, "g")), kMetaOfEarlierVersions);
}

// Earlier versions wrote a file name that is not UTF-8 as its bytes (generated as kMetaOfEarlierVersions, for the
// name "caf\xe9\xff.npy"); such a file still reads, its "meta_hash" matching those bytes. New saves write U+FFFD.
TEST_F(EmbeddingFiles, MetaFilesOfEarlierVersionsWithNamesThatAreNotUtf8) {
  const std::string meta_text = "{\n"
    "  \"format\": \"speedtorch.embedding\",\n"
    "  \"version\": 1,\n"
    "  \"num_rows\": 1e+05,\n"
    "  \"dim\": 1,\n"
    "  \"dtype\": \"float32\",\n"
    "  \"table_file\": \"caf\xe9\xff.npy\",\n"
    "  \"table_hash\": \"38990bc91bd46478\",\n"
    "  \"optimizer\": \"rprop\",\n"
    "  \"options\": {\n"
    "    \"lr\": 1e-04,\n"
    "    \"step_size_min\": -0,\n"
    "    \"step_size_max\": Infinity,\n"
    "    \"etaplus\": 1.2\n"
    "  },\n"
    "  \"step\": 1e+06,\n"
    "  \"state_file\": \"caf\xe9\xff.state.npy\",\n"
    "  \"state_hash\": \"38990bc91bd46478\",\n"
    "  \"state_width\": 1,\n"
    "  \"state_beside_rows\": 0,\n"
    "  \"meta_hash\": \"1d9dda5a48ceff75\"\n"
    "}\n"
    "";
  c10::Dict<std::string, double> o;
  o.insert("lr", 1e-4);
  o.insert("step_size_min", -0.0);
  o.insert("step_size_max", HUGE_VAL);
  o.insert("etaplus", 1.2);
  save_embedding_files(path("caf\xe9\xff.npy"), at::zeros({100000, 1}), at::zeros({100000, 1}), "rprop", o, 1000000,
                       false);
  write_bytes(path("caf\xe9\xff.meta.json"), meta_text);
  const EmbeddingMeta meta = read_embedding_meta(path("caf\xe9\xff.npy"));
  EXPECT_EQ(meta.step, 1000000);
  EXPECT_EQ(parse_meta_json(meta_text, "m").at("table_file").get<std::string>(), "caf\xe9\xff.npy");
  EXPECT_EQ(to_meta_json(parse_meta_json(meta_text, "m")), meta_text);
  // A damaged byte in such a file is still an error.
  std::string damaged = meta_text;
  damaged[damaged.find("\xe9")] = '\xe8';
  EXPECT_NE(error_of([&] {
              write_bytes(path("caf\xe9\xff.meta.json"), damaged);
              read_embedding_meta(path("caf\xe9\xff.npy"));
            }).find("meta_hash"),
            std::string::npos);
}

// The meta files checked in for the fuzz targets (written by earlier versions) read and write back unchanged.
TEST(MetaJson, CheckedInMetaFilesWriteBackByteForByte) {
  const std::string fuzz = std::string(SPEEDTORCH_SOURCE_DIR) + "/tests/fuzz/";
  const std::string separator = "\n@@speedtorch-fuzz-file@@\n";
  int checked = 0;
  for (const char* name : {"template/t.meta.json", "corpus/embedding_files/valid-template-meta",
                           "corpus/embedding_files/valid-template-all-files",
                           "corpus/embedding_files/valid-bf16-sgd-apart",
                           "corpus/embedding_files/valid-f16-no-optimizer", "corpus/embedding_files/options-nan"}) {
    std::ifstream in(fuzz + name, std::ios::binary);
    ASSERT_TRUE(in.good()) << name;
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text = text.substr(0, text.find(separator));  // the meta part of a fuzz input
    EXPECT_EQ(to_meta_json(parse_meta_json(text, name)), text) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

// A file name that is not UTF-8 (Linux allows any bytes) is written as valid UTF-8, which every JSON reader needs.
TEST_F(EmbeddingFiles, FileNamesThatAreNotUtf8) {
  save_embedding_files(path("caf\xe9.npy"), at::randn({3, 2}), at::Tensor(), "", c10::Dict<std::string, double>(), 0,
                       true);
  const std::string text = read_bytes(path("caf\xe9.meta.json"));
  EXPECT_NE(text.find("\"table_file\": \"caf\xef\xbf\xbd.npy\""), std::string::npos) << text;  // U+FFFD
  EXPECT_EQ(read_embedding_meta(path("caf\xe9.npy")).num_rows, 3);
  EXPECT_EQ(valid_utf8("ok \xc3\xa9"), "ok \xc3\xa9");
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
TEST(MetaJson, RejectsWhatJsonDoesNotAllow) {
  for (const std::string bad : {"{\"a\": 01}", "{\"a\": .5}", "{\"a\": 1.}", "{\"a\": +1}", "{\"a\": 1e}",
                                "{\"a\": inf}", "{\"a\": 0x10}", "{\"a\": nan}", "{\"a\": NaNa}", "{NaN: 1}",
                                "{\"a\": 1e400}", "{\"a\": \"\x01\"}", "{\"a\": 1} x"}) {
    EXPECT_NE(error_of([&] { parse_meta_json(bad, "m.json"); }).find("m.json is not valid JSON"), std::string::npos)
        << bad;
  }
  EXPECT_NE(error_of([&] { parse_meta_json(std::string("{\"a\":\0 1}", 9), "m.json"); }).find("not valid JSON"),
            std::string::npos);
  // (nlohmann-json alone would end its input at the NUL and take the object before it)
  EXPECT_NE(error_of([&] { parse_meta_json(std::string("{\"a\": 1}\0x", 10), "m.json"); }).find("NUL"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_meta_json("{\"a\": 1, \"a\": 2}", "m.json"); }).find("twice"), std::string::npos);
  std::string deep;
  for (int i = 0; i < 12; ++i) deep += "{\"a\": ";
  deep += "1" + std::string(12, '}');
  EXPECT_NE(error_of([&] { parse_meta_json(deep, "m.json"); }).find("nested too deeply"), std::string::npos);
  // Messages are ASCII whatever the file holds (Python decodes them as UTF-8).
  for (const std::string bad : {"{\"a\": \xff}", "{\"a\": \"\xff", "\xe9"}) {
    const std::string err = error_of([&] { parse_meta_json(bad, "m.json"); });
    EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
    EXPECT_TRUE(std::all_of(err.begin(), err.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
        << err;
  }
  // Strings that are not UTF-8 (earlier versions wrote file names' bytes as they were) read as their bytes.
  const MetaJson bytes = parse_meta_json("{\"a\": \"\xff\xfe\", \"\xc3\": \"\xc3\xa9\xe9\"}", "m.json");
  EXPECT_EQ(bytes.at("a").get<std::string>(), "\xff\xfe");
  EXPECT_EQ(bytes.at("\xc3").get<std::string>(), "\xc3\xa9\xe9");
  const MetaJson ok = parse_meta_json("{\"a\": -0.5e-3, \"b\": 0, \"c\": 10E+2, \"d\": -0, \"e\": -Infinity}", "m.json");
  EXPECT_EQ(ok.at("a").get<double>(), -0.5e-3);
  EXPECT_EQ(ok.at("b").get<double>(), 0.0);
  EXPECT_EQ(ok.at("c").get<double>(), 1000.0);
  EXPECT_TRUE(std::signbit(ok.at("d").get<double>()));
  EXPECT_EQ(ok.at("e").get<double>(), -HUGE_VAL);
  // The digits of NaN's stand-in in a file are the number they are.
  EXPECT_EQ(parse_meta_json("{\"a\": 18446744073709551615}", "m").at("a").get<double>(), 18446744073709551615.0);
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

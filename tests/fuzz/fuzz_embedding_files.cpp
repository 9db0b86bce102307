// libFuzzer target over the loading of a saved table: the meta file's JSON (csrc/io/meta_json.h, on nlohmann-json),
// its checks against the .npy headers and the data's content hashes (csrc/io/embedding_files.h), PinnedEmbedding::load
// with verify and PinnedEmbedding::open (csrc/embedding/pinned_embedding_io.cpp). load(path, verify=true) is what
// torch.jit.load runs for a model whose table lives in a sidecar (embedding_pickle.cpp), after the same
// read_embedding_meta. The input replaces files of a small valid save (tests/fuzz/template/, written by
// make_corpus.py); loading must then give a table consistent with the files or throw c10::Error whose message is
// valid UTF-8 (utf8_text.h). Any other exception, a crash or a sanitizer report is a bug.
//
// Input: up to three parts separated by the line "\n@@speedtorch-fuzz-file@@\n": the meta file (t.meta.json), the
// rows (t.npy), the optimizer state (t.state.npy). A missing part keeps the template's file; an empty first part
// leaves no meta file (the path of a plain .npy). Built and run by `make fuzz`; seeds in corpus/embedding_files/.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "embedding/pinned_embedding.h"
#include "io/embedding_files.h"
#include "utf8_text.h"

#ifndef SPEEDTORCH_FUZZ_TEMPLATE_DIR
#error "SPEEDTORCH_FUZZ_TEMPLATE_DIR must name tests/fuzz/template"
#endif

namespace {

using speedtorch::PinnedEmbedding;
namespace io = speedtorch::io;

constexpr char kSeparator[] = "\n@@speedtorch-fuzz-file@@\n";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    std::fprintf(stderr, "fuzz_embedding_files: cannot read the template file %s\n", path.c_str());
    std::abort();
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) std::abort();
  ::close(fd);
}

struct Scratch {
  std::string dir;
  std::string base;  // dir + "/t": t.npy, t.state.npy, t.meta.json
  std::string template_meta, template_table, template_state;
};

Scratch& scratch() {
  static Scratch* s = [] {
    auto* out = new Scratch();
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/speedtorch-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    out->dir = pattern;
    out->base = pattern + "/t";
    const std::string from = std::string(SPEEDTORCH_FUZZ_TEMPLATE_DIR) + "/t";
    out->template_meta = read_file(from + ".meta.json");
    out->template_table = read_file(from + ".npy");
    out->template_state = read_file(from + ".state.npy");
    std::atexit([] {
      const Scratch& s = scratch();
      for (const char* tail : {".npy", ".state.npy", ".meta.json"}) ::unlink((s.base + tail).c_str());
      ::rmdir(s.dir.c_str());
    });
    return out;
  }();
  return *s;
}

std::vector<std::string> split_parts(const uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::string sep(kSeparator);
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (parts.size() < 2) {
    const std::size_t at = input.find(sep, start);
    if (at == std::string::npos) break;
    parts.push_back(input.substr(start, at - start));
    start = at + sep.size();
  }
  parts.push_back(input.substr(start));
  return parts;
}

[[noreturn]] void inconsistent(const std::string& what) {
  std::fprintf(stderr, "fuzz_embedding_files: a load succeeded but %s\n", what.c_str());
  std::abort();
}

// A table loaded with verify from files with a meta file holds exactly the data the meta's hashes describe.
void check_loaded(const PinnedEmbedding& e, const io::EmbeddingMeta& meta) {
  if (e.num_rows() != meta.num_rows || e.dim() != meta.dim) inconsistent("the table's shape differs from the meta");
  if (!meta.has_meta_file) return;
  const at::Tensor rows = e.table().contiguous();
  if (io::content_hash_of(rows) != meta.table_hash) inconsistent("the rows do not hash to the meta's table_hash");
  // Optimizer names are read whatever their case ("adaM" is Adam); the table holds the canonical lower-case one.
  std::string optimizer = meta.optimizer;
  std::transform(optimizer.begin(), optimizer.end(), optimizer.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (e.optimizer() != optimizer || e.step_count() != meta.step) inconsistent("optimizer or step differ");
  if (!meta.optimizer.empty() && io::content_hash_of(e.state().contiguous()) != meta.state_hash) {
    inconsistent("the state does not hash to the meta's state_hash");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const Scratch& s = scratch();
  const std::vector<std::string> parts = split_parts(data, size);
  const std::string meta_path = s.base + ".meta.json";
  if (parts[0].empty()) {
    ::unlink(meta_path.c_str());
  } else {
    write_file(meta_path, parts[0]);
  }
  write_file(s.base + ".npy", parts.size() > 1 ? parts[1] : s.template_table);
  write_file(s.base + ".state.npy", parts.size() > 2 ? parts[2] : s.template_state);

  io::EmbeddingMeta meta;
  try {
    meta = io::read_embedding_meta(s.base + ".npy");
  } catch (const c10::Error& e) {
    speedtorch::fuzzing::check_message(e, "fuzz_embedding_files");
    return 0;
  }
  try {
    const auto loaded = PinnedEmbedding::load(s.base + ".npy", /*verify=*/true);
    check_loaded(*loaded, meta);
  } catch (const c10::Error& e) {
    speedtorch::fuzzing::check_message(e, "fuzz_embedding_files");
  }
  try {
    // A mapped table reads the files in place: every byte of it must lie inside them.
    const auto mapped = PinnedEmbedding::open(s.base + ".npy", "c");
    (void)mapped->table().sum().item<double>();
    if (mapped->state().defined()) (void)mapped->state().sum().item<double>();
  } catch (const c10::Error& e) {
    speedtorch::fuzzing::check_message(e, "fuzz_embedding_files");
  }
  return 0;
}

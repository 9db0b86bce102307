// Tests for PinnedEmbedding's files (csrc/embedding/pinned_embedding_io.cpp) and its pickled form inside saved
// models (csrc/embedding/embedding_pickle), used from C++ directly.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "embedding/embedding_pickle.h"
#include "embedding/pinned_embedding.h"
#include "error_text.h"
#include "io/embedding_files.h"
#include "io/npy_file.h"
#include "temp_dir.h"

namespace speedtorch {
namespace {

using speedtorch::testing::error_of;

class PinnedEmbeddingFiles : public speedtorch::testing::TempDirTest {
 protected:
  void TearDown() override {
    unsetenv("SPEEDTORCH_SIDECAR_DIR");
    unsetenv("SPEEDTORCH_INLINE_MAX_BYTES");
    TempDirTest::TearDown();
  }

  // A trained table: random rows, a few Adam steps with duplicate ids.
  static c10::intrusive_ptr<PinnedEmbedding> trained(int64_t rows, int64_t dim, c10::ScalarType dtype,
                                                     bool beside = true) {
    auto e = c10::make_intrusive<PinnedEmbedding>(rows, dim, dtype);
    c10::Dict<std::string, double> options;
    options.insert("lr", 0.01);
    options.insert("amsgrad", 1.0);
    e->set_optimizer("adam", options, beside);
    e->normal_(0.0, 1.0, 5);
    for (int step = 0; step < 3; ++step) {
      const at::Tensor ids = at::randint(0, rows, {rows / 2 + 1});
      e->apply_gradients(ids, at::randn({ids.size(0), dim}));
    }
    return e;
  }

  static void expect_same(const PinnedEmbedding& a, const PinnedEmbedding& b) {
    EXPECT_TRUE(at::equal(a.table(), b.table()));
    EXPECT_EQ(a.optimizer(), b.optimizer());
    EXPECT_EQ(a.step_count(), b.step_count());
    ASSERT_EQ(a.optimizer_options().size(), b.optimizer_options().size());
    for (const auto& entry : a.optimizer_options()) {
      EXPECT_EQ(b.optimizer_options().at(entry.key()), entry.value()) << entry.key();
    }
    ASSERT_EQ(a.state().defined(), b.state().defined());
    if (a.state().defined()) EXPECT_TRUE(at::equal(a.state(), b.state()));
  }
};

TEST_F(PinnedEmbeddingFiles, SaveLoadKeepsRowsStateAndConfig) {
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (const bool beside : {true, false}) {
      auto e = trained(257, 12, dtype, beside);
      e->save(path("t.npy"));
      auto back = PinnedEmbedding::load(path("t.npy"), true);
      expect_same(*e, *back);
      EXPECT_EQ(back->table().stride(0) != 12, beside);  // the layout comes back too
      EXPECT_TRUE(back->mapping().empty());
    }
  }
}

TEST_F(PinnedEmbeddingFiles, OpenMapsTheFilesInPlace) {
  auto e = trained(300, 8, at::kFloat, true);
  e->save(path("t.npy"));
  auto ro = PinnedEmbedding::open(path("t.npy"), "r");
  expect_same(*e, *ro);
  EXPECT_EQ(ro->mapping(), "r");
  EXPECT_NE(error_of([&] { ro->scatter_(at::tensor({1}), at::randn({1, 8})); }).find("opened read-only"),
            std::string::npos);

  // 'c': changes stay in memory.
  auto cow = PinnedEmbedding::open(path("t.npy"), "c");
  cow->scatter_(at::tensor({4}), at::randn({1, 8}));
  EXPECT_NE(error_of([&] { cow->flush(); }).find("only a table opened with mode 'r+'"), std::string::npos);
  expect_same(*e, *PinnedEmbedding::load(path("t.npy"), true));

  // 'r+': training changes the files; flush() makes the meta match (step count, hashes).
  auto rw = PinnedEmbedding::open(path("t.npy"), "r+");
  rw->apply_gradients(at::tensor({1, 2, 2}), at::randn({3, 8}));
  EXPECT_NE(error_of([&] { PinnedEmbedding::load(path("t.npy"), true); }).find("without flush()"), std::string::npos);
  rw->flush();
  auto after = PinnedEmbedding::load(path("t.npy"), true);
  expect_same(*rw, *after);
  EXPECT_EQ(after->step_count(), e->step_count() + 1);
  rw->save(path("t.npy"));  // onto its own files: a flush, not a rename over the mapping
  expect_same(*rw, *PinnedEmbedding::load(path("t.npy"), true));

  EXPECT_NE(error_of([&] { PinnedEmbedding::open(path("t.npy"), "w"); }).find("mode must be"), std::string::npos);
  EXPECT_NE(error_of([&] { rw->set_optimizer("sgd", c10::Dict<std::string, double>(), true); }).find("state_beside_rows=False"),
            std::string::npos);
}

TEST_F(PinnedEmbeddingFiles, OpenAPlainNpyAndTrainIt) {
  const at::Tensor rows = at::randn({100, 4});
  io::save_npy(rows, path("plain.npy"));
  auto e = PinnedEmbedding::open(path("plain.npy"), "r+");
  EXPECT_TRUE(at::equal(e->table(), rows));
  e->set_optimizer("sgd", c10::Dict<std::string, double>(), /*state_beside_rows=*/false);
  e->apply_gradients(at::tensor({3}), at::ones({1, 4}));
  e->flush();  // writes the state file and a meta file
  auto back = PinnedEmbedding::load(path("plain.npy"), true);
  expect_same(*e, *back);
  EXPECT_FALSE(at::equal(back->table(), rows));
  io::save_npy(at::randn({10, 4}, at::kDouble), path("f64.npy"));
  EXPECT_NE(error_of([&] { PinnedEmbedding::open(path("f64.npy"), "r"); }).find("load() converts"),
            std::string::npos);
}

// Collects the warnings raised while it is installed (c10::WarningUtils::WarningHandlerGuard).
class CollectWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;
};

TEST_F(PinnedEmbeddingFiles, PickledInline) {
  auto e = trained(100, 6, at::kHalf, true);
  auto back = unpickle_embedding(pickle_embedding(e));
  expect_same(*e, *back);
  EXPECT_TRUE(std::get<4>(pickle_embedding(e)).size() == 2);
  // Past SPEEDTORCH_INLINE_MAX_BYTES without a sidecar: kept inline with a warning, never refused (torch.jit.save
  // has truncated the target file when pickling runs: a refusal would destroy the model saved there).
  setenv("SPEEDTORCH_INLINE_MAX_BYTES", "1000", 1);
  CollectWarnings warnings;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    expect_same(*e, *unpickle_embedding(pickle_embedding(e)));
  }
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("set_sidecar"), std::string::npos) << warnings.messages[0];
}

TEST_F(PinnedEmbeddingFiles, PickledWithASidecar) {
  auto e = trained(100, 6, at::kFloat, false);
  setenv("SPEEDTORCH_SIDECAR_DIR", dir_.c_str(), 1);
  e->set_sidecar("side.npy");  // relative: under SPEEDTORCH_SIDECAR_DIR
  PickledEmbedding state = pickle_embedding(e);
  EXPECT_TRUE(std::get<4>(state).empty());
  EXPECT_EQ(file_count(), 3u);
  auto back = unpickle_embedding(state);
  expect_same(*e, *back);
  EXPECT_EQ(back->sidecar(), "side.npy");

  // A later save of the same table replaces the sidecar: the first model no longer matches it.
  e->apply_gradients(at::tensor({0}), at::randn({1, 6}));
  (void)pickle_embedding(e);
  EXPECT_NE(error_of([&] { unpickle_embedding(state); }).find("not the table this model was saved with"),
            std::string::npos);

  state = pickle_embedding(e);
  unsetenv("SPEEDTORCH_SIDECAR_DIR");  // now resolved against the current directory: not there
  const std::string missing = error_of([&] { unpickle_embedding(state); });
  EXPECT_NE(missing.find("missing: side.npy, side.meta.json, side.state.npy"), std::string::npos) << missing;
  EXPECT_NE(missing.find("set SPEEDTORCH_SIDECAR_DIR"), std::string::npos);

  setenv("SPEEDTORCH_SIDECAR_DIR", dir_.c_str(), 1);
  const std::string table_bytes = read_bytes(path("side.npy"));
  write_bytes(path("side.npy"), table_bytes.substr(0, table_bytes.size() - 8));  // truncated
  EXPECT_NE(error_of([&] { unpickle_embedding(state); }).find("is truncated"), std::string::npos);
}

// The identity of a file's current version: a save replaces files (a new inode) and writes them (a new mtime).
std::pair<ino_t, int64_t> file_version(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return {st.st_ino, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

// Pickling again (what copy.deepcopy of a scripted model does) leaves files that hold the table alone; any change
// of the rows, the state, the step count or the options gets them written. Both state layouts: side by side, the
// rows are hashed through their stride.
TEST_F(PinnedEmbeddingFiles, PicklingASidecarWritesOnlyWhatChanged) {
  for (const bool beside : {true, false}) {
    auto e = trained(100, 6, at::kFloat, beside);
    const std::string side = path(beside ? "beside.npy" : "apart.npy");
    const io::EmbeddingPaths files = io::embedding_paths(side);
    e->set_sidecar(side);
    const PickledEmbedding first = pickle_embedding(e);
    const auto rows = file_version(files.table);
    const auto state = file_version(files.state);
    const auto meta = file_version(files.meta);

    const PickledEmbedding again = pickle_embedding(e);
    EXPECT_EQ(file_version(files.table), rows) << "beside=" << beside;
    EXPECT_EQ(file_version(files.state), state) << "beside=" << beside;
    EXPECT_EQ(file_version(files.meta), meta) << "beside=" << beside;
    EXPECT_EQ(std::get<1>(again).at("table_hash"), std::get<1>(first).at("table_hash"));
    expect_same(*e, *unpickle_embedding(again));

    // A row changed behind the table's back (through the tensor table() returns): found by the hash.
    e->table()[7].fill_(3.0f);
    expect_same(*e, *unpickle_embedding(pickle_embedding(e)));
    EXPECT_NE(file_version(files.table), rows) << "beside=" << beside;
    EXPECT_NE(error_of([&] { unpickle_embedding(first); }).find("not the table this model was saved with"),
              std::string::npos);

    const auto meta_before_step = file_version(files.meta);
    e->set_step_count(e->step_count() + 1);
    expect_same(*e, *unpickle_embedding(pickle_embedding(e)));
    EXPECT_NE(file_version(files.meta), meta_before_step) << "beside=" << beside;
  }
}

}  // namespace
}  // namespace speedtorch

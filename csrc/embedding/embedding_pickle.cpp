// A PinnedEmbedding's pickled state inside saved models: inline tensors or a sidecar (see embedding_pickle.h).
#include "embedding/embedding_pickle.h"

#include <c10/util/Exception.h>

#include <sys/stat.h>

#include <cstdlib>
#include <optional>
#include <utility>

#include "io/embedding_files.h"

namespace speedtorch {
namespace {

constexpr int64_t kDefaultInlineMaxBytes = int64_t{64} << 20;

thread_local bool sidecar_failures_raise = false;

const std::string& text_field(const c10::Dict<std::string, std::string>& d, const std::string& key) {
  const auto it = d.find(key);
  TORCH_CHECK(it != d.end(), "PinnedEmbedding: the saved model's table lacks '", key, "' (a corrupt archive?)");
  return it->value();
}

int64_t int_field(const c10::Dict<std::string, int64_t>& d, const std::string& key) {
  const auto it = d.find(key);
  TORCH_CHECK(it != d.end(), "PinnedEmbedding: the saved model's table lacks '", key, "' (a corrupt archive?)");
  return it->value();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string how_resolved(const std::string& path) {
  if (!path.empty() && path[0] == '/') return "an absolute path";
  const char* dir = std::getenv("SPEEDTORCH_SIDECAR_DIR");
  return dir != nullptr && *dir != '\0' ? std::string("under SPEEDTORCH_SIDECAR_DIR=") + dir
                                        : std::string("relative to the current directory; set SPEEDTORCH_SIDECAR_DIR "
                                                      "to the directory that holds it");
}

}  // namespace

bool set_sidecar_failures_raise(bool raise_on_failure) {
  return std::exchange(sidecar_failures_raise, raise_on_failure);
}

int64_t inline_max_bytes() {
  const char* env = std::getenv("SPEEDTORCH_INLINE_MAX_BYTES");
  if (env == nullptr || *env == '\0') return kDefaultInlineMaxBytes;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  TORCH_CHECK(end != env && *end == '\0' && v >= 0, "SPEEDTORCH_INLINE_MAX_BYTES must be a number of bytes, got '",
              env, "'");
  return static_cast<int64_t>(v);
}

std::string resolve_sidecar_path(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const char* dir = std::getenv("SPEEDTORCH_SIDECAR_DIR");
  if (dir == nullptr || *dir == '\0') return path;
  std::string base(dir);
  if (base.back() != '/') base.push_back('/');
  return base + path;
}

PickledEmbedding pickle_embedding(const c10::intrusive_ptr<PinnedEmbedding>& e) {
  // Every part is taken from one consistent state of the table (one save, or one snapshot), so an optimizer step
  // another thread applies meanwhile lands entirely before or entirely after what the model records.
  c10::Dict<std::string, std::string> text;
  c10::Dict<std::string, int64_t> ints;
  c10::Dict<std::string, double> options;
  std::vector<at::Tensor> tensors;
  const std::string sidecar = e->sidecar();
  std::optional<io::EmbeddingMeta> saved;
  if (!sidecar.empty()) {
    // Pickling is not only torch.jit.save: copy.deepcopy of a scripted model pickles too. Files that already hold
    // this very table are left alone, so a copy never rewrites them; a changed table is saved.
    try {
      saved = e->save_unless_held(resolve_sidecar_path(sidecar));
    } catch (const c10::Error& error) {
      if (sidecar_failures_raise) throw;
      TORCH_WARN("PinnedEmbedding: the sidecar '", sidecar, "' could not be written (", error.what_without_backtrace(),
                 "); the table and its optimizer state are pickled inline instead, since torch.jit.save has already "
                 "truncated its target and a refusal would lose the model saved there. speedtorch.jit_save raises "
                 "here and keeps the old file");
    }
  }
  if (saved) {
    const io::EmbeddingMeta& meta = *saved;
    text.insert("dtype", io::dtype_name(meta.dtype));
    text.insert("optimizer", meta.optimizer);
    ints.insert("num_rows", meta.num_rows);
    ints.insert("dim", meta.dim);
    ints.insert("step", meta.step);
    ints.insert("state_width", meta.state_width);
    ints.insert("state_beside_rows", !meta.optimizer.empty() && meta.state_beside_rows ? 1 : 0);
    text.insert("sidecar", sidecar);
    text.insert("table_hash", meta.table_hash);
    text.insert("state_hash", meta.state_hash);
    options = meta.options.copy();
  } else {
    // A warning, not a refusal: torch.jit.save has already truncated the target file when this runs, so refusing
    // here would destroy the model saved there before (issue 22). The table is kept inline, whatever its size.
    if (sidecar.empty() && e->nbytes() > inline_max_bytes()) {
      TORCH_WARN("PinnedEmbedding: this table and its optimizer state take ", e->nbytes(), " bytes, more than the ",
                 inline_max_bytes(), " that SPEEDTORCH_INLINE_MAX_BYTES keeps inside a saved model; they are pickled "
                 "inline all the same, with a copy of them in host memory meanwhile. Call "
                 "set_sidecar(\"users.npy\") on the table before torch.jit.save to keep it in files of its own");
    }
    PinnedEmbedding::Snapshot snap = e->snapshot();
    text.insert("dtype", io::dtype_name(snap.table.scalar_type()));
    text.insert("optimizer", snap.optimizer);
    ints.insert("num_rows", snap.table.size(0));
    ints.insert("dim", snap.table.size(1));
    ints.insert("step", snap.step);
    ints.insert("state_width", snap.state.defined() ? snap.state.size(1) : 0);
    ints.insert("state_beside_rows", snap.state_beside_rows ? 1 : 0);
    text.insert("sidecar", "");
    text.insert("table_hash", "");
    text.insert("state_hash", "");
    tensors.push_back(std::move(snap.table));
    if (snap.state.defined()) tensors.push_back(std::move(snap.state));
    options = std::move(snap.options);
  }
  return {kPickleVersion, std::move(text), std::move(ints), std::move(options), std::move(tensors)};
}

c10::intrusive_ptr<PinnedEmbedding> unpickle_embedding(PickledEmbedding state) {
  const int64_t version = std::get<0>(state);
  TORCH_CHECK(version == kPickleVersion, "PinnedEmbedding: the saved model holds a table in format version ", version,
              "; this speedtorch reads version ", kPickleVersion, " (saved by a newer speedtorch? upgrade it)");
  const auto& text = std::get<1>(state);
  const auto& ints = std::get<2>(state);
  const auto& options = std::get<3>(state);
  const auto& tensors = std::get<4>(state);
  const int64_t num_rows = int_field(ints, "num_rows");
  const int64_t dim = int_field(ints, "dim");
  const int64_t step = int_field(ints, "step");
  const int64_t width = int_field(ints, "state_width");
  const c10::ScalarType dtype = io::dtype_from_name(text_field(text, "dtype"));
  const std::string& optimizer = text_field(text, "optimizer");
  const std::string& sidecar = text_field(text, "sidecar");

  if (!sidecar.empty()) {
    const std::string resolved = resolve_sidecar_path(sidecar);
    const io::EmbeddingPaths paths = io::embedding_paths(resolved);
    std::string missing;  // the sidecar's files that are not where the path resolved to
    for (const std::string* file : {&paths.table, &paths.meta, &paths.state}) {
      if ((file != &paths.state || !optimizer.empty()) && !exists(*file)) missing += (missing.empty() ? "" : ", ") + *file;
    }
    TORCH_CHECK(missing.empty(), "PinnedEmbedding: the model's table lives in the sidecar '", sidecar,
                "', looked for as ", paths.table, ", ", paths.meta, optimizer.empty() ? "" : " and " + paths.state,
                " (", how_resolved(sidecar), "); missing: ", missing,
                ". Copy the sidecar files (.npy, .state.npy, .meta.json) there");
    const io::EmbeddingMeta meta = io::read_embedding_meta(resolved);  // headers checked: truncation shows here
    TORCH_CHECK(meta.num_rows == num_rows && meta.dim == dim && meta.dtype == dtype && meta.optimizer == optimizer,
                "PinnedEmbedding: the sidecar ", paths.table, " holds a ", meta.num_rows, " x ", meta.dim, " ",
                io::dtype_name(meta.dtype), " table (optimizer '", meta.optimizer, "'); the model was saved with a ",
                num_rows, " x ", dim, " ", io::dtype_name(dtype), " table (optimizer '", optimizer, "')");
    TORCH_CHECK(meta.table_hash == text_field(text, "table_hash") && meta.state_hash == text_field(text, "state_hash"),
                "PinnedEmbedding: the sidecar ", paths.table, " is not the table this model was saved with (content "
                "hash ", meta.table_hash, ", the model expects ", text_field(text, "table_hash"), "): it was "
                "overwritten by a later save, or belongs to another model");
    auto e = PinnedEmbedding::load(resolved, /*verify=*/true);  // the data itself against those hashes
    e->set_step_count(step);
    e->set_sidecar(sidecar);
    return e;
  }

  const std::size_t expected = optimizer.empty() ? 1 : 2;
  TORCH_CHECK(tensors.size() == expected, "PinnedEmbedding: the saved model's table has ", tensors.size(),
              " tensors, expected ", expected, " (a corrupt archive?)");
  TORCH_CHECK(tensors[0].dim() == 2 && tensors[0].size(0) == num_rows && tensors[0].size(1) == dim &&
                  tensors[0].scalar_type() == dtype,
              "PinnedEmbedding: the saved model's rows are ", tensors[0].scalar_type(), " ", tensors[0].sizes(),
              ", its record says ", io::dtype_name(dtype), " (", num_rows, ", ", dim, ") (a corrupt archive?)");
  auto e = c10::make_intrusive<PinnedEmbedding>(num_rows, dim, dtype);
  if (!optimizer.empty()) {
    e->set_optimizer(optimizer, options, int_field(ints, "state_beside_rows") != 0);
    at::Tensor dst = e->state();
    TORCH_CHECK(dst.size(1) == width && tensors[1].dim() == 2 && tensors[1].size(0) == num_rows &&
                    tensors[1].size(1) == width && tensors[1].scalar_type() == at::kFloat,
                "PinnedEmbedding: the saved model's optimizer state is ", tensors[1].scalar_type(), " ",
                tensors[1].sizes(), "; ", optimizer, " here keeps float32 (", num_rows, ", ", dst.size(1), ")");
    dst.copy_(tensors[1]);
  }
  e->copy_(tensors[0]);
  e->set_step_count(step);
  return e;
}

}  // namespace speedtorch

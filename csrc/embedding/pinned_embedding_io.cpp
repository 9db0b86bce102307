// PinnedEmbedding's files: save, load, open (memory-mapped) and flush (see pinned_embedding.h; the file formats are
// io/embedding_files.h's).
#include <c10/util/Exception.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <shared_mutex>
#include <vector>

#include "embedding/pinned_embedding.h"
#include "io/embedding_files.h"
#include "io/file_mode.h"
#include "io/mapped_file_guard.h"
#include "io/npy_file.h"
#include "optim/optimizer_config.h"
#include "memory/host_access_tracker.h"

namespace speedtorch {
namespace {

FileMapping mapping_of_mode(const std::string& mode) {
  if (mode == "r") return FileMapping::kReadOnly;
  if (mode == "r+") return FileMapping::kReadWrite;
  if (mode == "c") return FileMapping::kCopyOnWrite;
  TORCH_CHECK(false, "PinnedEmbedding.open: mode must be 'r' (read-only), 'r+' (changes reach the file) or 'c' "
              "(copy-on-write), as numpy.load's mmap_mode; got '", mode, "'");
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

bool same_options(const c10::Dict<std::string, double>& a, const c10::Dict<std::string, double>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& entry : a) {
    const auto other = b.find(entry.key());
    if (other == b.end() || other->value() != entry.value()) return false;
  }
  return true;
}

std::string mode_of_mapping(FileMapping mapping) {
  switch (mapping) {
    case FileMapping::kReadOnly: return "r";
    case FileMapping::kReadWrite: return "r+";
    case FileMapping::kCopyOnWrite: return "c";
    case FileMapping::kNone: break;
  }
  return "";
}

// Saving and flushing only read the table: they share the lock with gathers, and writers wait until the files are
// on disk, so the files hold the rows, state and step count of one moment.
using ReadLock = std::shared_lock<TableLock>;

}  // namespace

std::string PinnedEmbedding::mapping() const {
  ReadLock read(lock_);
  return mode_of_mapping(table_buffer_->mapping());
}

bool PinnedEmbedding::state_is_mapped() const {
  return state_buffer_ != nullptr && state_buffer_->mapping() != FileMapping::kNone;
}

void PinnedEmbedding::save(const std::string& path) const {
  ReadLock read(lock_);
  write_back_cache(false);
  save_locked(path);
}

io::EmbeddingMeta PinnedEmbedding::save_unless_held(const std::string& path) const {
  ReadLock read(lock_);
  write_back_cache(false);
  if (!files_hold_table_locked(path)) save_locked(path);
  return io::read_embedding_meta(path);
}

bool PinnedEmbedding::files_hold_table_locked(const std::string& path) const {
  const io::EmbeddingPaths paths = io::embedding_paths(path);
  io::EmbeddingMeta meta;
  try {
    if (::access(paths.meta.c_str(), F_OK) != 0) return false;
    meta = io::read_embedding_meta(path);
    // The data files are whole (a truncated one is rewritten, not trusted).
    const io::NpyHeader rows = io::read_npy_header(paths.table);
    if (file_size(paths.table) != rows.data_offset + rows.data_bytes()) return false;
    if (state_.defined()) {
      const io::NpyHeader state = io::read_npy_header(paths.state);
      if (file_size(paths.state) != state.data_offset + state.data_bytes()) return false;
    }
  } catch (const c10::Error&) {
    return false;  // unreadable or damaged files: write them again
  }
  const bool beside = state_.defined() && state_buffer_ == nullptr;
  const bool same_config = meta.has_meta_file && meta.num_rows == table_.size(0) && meta.dim == table_.size(1) &&
                           meta.dtype == table_.scalar_type() && meta.optimizer == optimizer_ && meta.step == step_ &&
                           meta.state_width == (state_.defined() ? state_.size(1) : 0) &&
                           (!state_.defined() || meta.state_beside_rows == beside) &&
                           same_options(meta.options, options_);
  if (!same_config) {
    return false;
  }
  // The rows themselves, hashed now (GPU kernels still writing them finish first).
  wait_for_uva_conflicts(table_.storage().data(), UvaAccess::kRead);
  if (state_.defined()) wait_for_uva_conflicts(state_.storage().data(), UvaAccess::kRead);
  return meta.table_hash == io::content_hash_of_rows(table_) &&
         meta.state_hash == (state_.defined() ? io::content_hash_of_rows(state_) : std::string());
}

void PinnedEmbedding::save_locked(const std::string& path) const {
  // Saving an 'r+' table onto its own files would rename new files over the mapped ones: flush them instead
  // (io/mapped_file_guard.h: the rule save_npy follows too; other data onto a mapped file is refused).
  if (io::saves_mapped_data_itself(io::embedding_paths(path).table, table_, "PinnedEmbedding.save")) {
    TORCH_CHECK(table_buffer_->mapping() == FileMapping::kReadWrite, "PinnedEmbedding.save: internal error: a "
                "table matching an 'r+' mapping of ", path, " is not mapped itself");
    flush_locked();
    return;
  }
  // GPU kernels still writing rows or state must finish before the files are written.
  wait_for_uva_conflicts(table_.storage().data(), UvaAccess::kRead);
  if (state_.defined()) wait_for_uva_conflicts(state_.storage().data(), UvaAccess::kRead);
  io::save_embedding_files(path, table_, state_, optimizer_, options_, step_,
                           state_.defined() && state_buffer_ == nullptr);
}

c10::intrusive_ptr<PinnedEmbedding> PinnedEmbedding::load(const std::string& path, bool verify) {
  const io::EmbeddingMeta meta = io::read_embedding_meta(path);
  auto e = c10::make_intrusive<PinnedEmbedding>(meta.num_rows, meta.dim, meta.dtype);
  if (!meta.optimizer.empty()) {
    // Configured while the table is still empty, so the rows are then read straight into their final layout.
    e->set_optimizer(meta.optimizer, meta.options, meta.state_beside_rows);
    TORCH_CHECK(e->state_.size(1) == meta.state_width, "PinnedEmbedding.load: ", path, ": ", meta.optimizer,
                " with these options keeps ", e->state_.size(1), " floats of state per row, the state file holds ",
                meta.state_width, " (written by another speedtorch version?)");
  }
  io::load_embedding_files(path, meta, e->table_, e->state_, verify);
  e->step_ = meta.step;
  return e;
}

c10::intrusive_ptr<PinnedEmbedding> PinnedEmbedding::open(const std::string& path, const std::string& mode) {
  const FileMapping mapping = mapping_of_mode(mode);
  return map_files(path, io::read_embedding_meta(path), mapping);
}

c10::intrusive_ptr<PinnedEmbedding> PinnedEmbedding::create(const std::string& path, int64_t num_rows, int64_t dim,
                                                            c10::ScalarType dtype, const std::string& optimizer,
                                                            const c10::Dict<std::string, double>& options) {
  TORCH_CHECK(num_rows > 0, "PinnedEmbedding.create: num_rows must be > 0, got ", num_rows);
  auto validated = c10::make_intrusive<PinnedEmbedding>(int64_t{0}, dim, dtype);  // checks dim and dtype
  io::EmbeddingMeta meta;
  meta.num_rows = num_rows;
  meta.dim = dim;
  meta.dtype = dtype;
  meta.optimizer = optimizer;
  meta.options = options.copy();
  meta.state_width = optimizer.empty() ? 0 : state_width(optimizer, options, dim);  // validates name and options
  meta.state_beside_rows = false;  // each in a file of its own, as open() maps them
  const io::EmbeddingPaths paths = io::embedding_paths(path);
  // Refused before anything is touched when any of the three files is there (a table someone else uses, or a
  // state or meta file that would end up beside rows it does not describe).
  for (const std::string* file : {&paths.table, &paths.state, &paths.meta}) {
    const int err = ::access(file->c_str(), F_OK) == 0 ? EEXIST : errno;
    TORCH_CHECK(err == ENOENT, "PinnedEmbedding.create: cannot create ", *file, ": ", std::strerror(err),
                " (create() makes new files only: remove the table's files first, or open it with "
                "PinnedEmbedding.open)");
  }
  // Each file is created exclusively (O_EXCL), so one made by someone else in the meantime is never taken over;
  // on failure only the files made here are removed.
  std::vector<std::string> made;
  try {
    io::create_zero_npy(paths.table, dtype, {num_rows, dim});
    made.push_back(paths.table);
    if (meta.state_width > 0) {
      io::create_zero_npy(paths.state, at::kFloat, {num_rows, meta.state_width});
      made.push_back(paths.state);
    }
    // The meta's name is claimed the same way; write_embedding_meta then replaces that empty file atomically.
    const int fd = io::open_new_file(paths.meta);
    TORCH_CHECK(fd >= 0, "PinnedEmbedding.create: cannot create ", paths.meta, ": ", std::strerror(errno));
    ::close(fd);
    made.push_back(paths.meta);
    auto e = map_files(path, meta, FileMapping::kReadWrite);
    io::write_embedding_meta(path, meta, e->table_, e->state_);
    return e;
  } catch (...) {  // half-made files would only be in the way of the next try
    for (const std::string& file : made) ::unlink(file.c_str());
    throw;
  }
}

c10::intrusive_ptr<PinnedEmbedding> PinnedEmbedding::map_files(const std::string& path, const io::EmbeddingMeta& meta,
                                                               FileMapping mapping) {
  const io::EmbeddingPaths paths = io::embedding_paths(path);
  auto e = c10::make_intrusive<PinnedEmbedding>(int64_t{0}, meta.dim, meta.dtype);
  // Each file's header is read from its mapping, and checked against the meta read before: a save that replaced
  // the files in between is an error, never a view past the end of a smaller file.
  auto table_buffer = std::make_shared<PinnedHostBuffer>(paths.table, mapping, /*pin=*/true);
  const io::NpyHeader header = io::mapped_npy_header(table_buffer->data(), table_buffer->size(), paths.table);
  TORCH_CHECK(header.dtype == meta.dtype || (header.dtype == at::kUInt16 && meta.dtype == at::kBFloat16),
              "PinnedEmbedding.open: ", paths.table, " holds ", header.descr, " data; a mapped table is used as the "
              "file stores it, and tables are float32, float16 or bfloat16. load() converts it, or save the array "
              "as float32");
  io::check_table_header(header, meta, paths.table, paths.meta);
  e->table_ = tensor_over(table_buffer, header.data_offset, {meta.num_rows, meta.dim}, {meta.dim, 1}, meta.dtype);
  e->table_buffer_ = std::move(table_buffer);
  if (!meta.optimizer.empty()) {
    const int64_t width = state_width(meta.optimizer, meta.options, meta.dim);  // validates name and options
    TORCH_CHECK(width == meta.state_width, "PinnedEmbedding.open: ", paths.state, " holds ", meta.state_width,
                " floats of state per row; ", meta.optimizer, " with these options keeps ", width);
    auto state_buffer = std::make_shared<PinnedHostBuffer>(paths.state, mapping, /*pin=*/true);
    const io::NpyHeader state_header =
        io::mapped_npy_header(state_buffer->data(), state_buffer->size(), paths.state);
    io::check_state_header(state_header, meta, paths.state);
    e->state_ = tensor_over(state_buffer, state_header.data_offset, {meta.num_rows, width}, {width, 1}, at::kFloat);
    e->state_buffer_ = std::move(state_buffer);
    e->optimizer_ = canonical_optimizer_name(meta.optimizer);  // files of older saves may name an alias
    e->options_ = meta.options.copy();
    e->step_ = meta.step;
  }
  e->files_path_ = path;
  return e;
}

void PinnedEmbedding::flush() {
  ReadLock read(lock_);
  write_back_cache(false);
  flush_locked();
}

void PinnedEmbedding::flush_locked() const {
  const std::string mode = mode_of_mapping(table_buffer_->mapping());
  TORCH_CHECK(table_buffer_->mapping() == FileMapping::kReadWrite, "PinnedEmbedding.flush: only a table opened with "
              "mode 'r+' writes back to its files; this one is ", mode.empty() ? "in memory" : "mapped with '" +
              mode + "'", "; use save(path)");
  wait_for_uva_conflicts(table_.storage().data(), UvaAccess::kRead);
  if (state_.defined()) wait_for_uva_conflicts(state_.storage().data(), UvaAccess::kRead);
  // An optimizer configured after open() gets a state file of its own now. It is written (to a temporary) before
  // any page is written back, so whatever refuses it (a mapping of the old state file this process still holds, a
  // full disk) leaves the files as they were: rows, state and meta stay the pair the last flush wrote.
  std::unique_ptr<io::NpyWriter> new_state;
  if (state_.defined() && !state_is_mapped()) {
    const std::string state_path = io::embedding_paths(files_path_).state;
    TORCH_CHECK(read_write_mappings_of_file(state_path).empty(), "PinnedEmbedding.flush: the optimizer was "
                "configured after open(), so its state needs a new ", state_path, ", but this process maps that "
                "file read-write (another table opened on these files, or speedtorch.data.open_npy): replacing it "
                "would leave that mapping on an unlinked file. Drop it, then flush again (this flush wrote nothing)");
    new_state = std::make_unique<io::NpyWriter>(state_path, at::kFloat, state_.sizes().vec());
    new_state->write(state_);
    new_state->finish();
  }
  table_buffer_->flush();
  if (new_state) {
    new_state->commit();
  } else if (state_.defined()) {
    state_buffer_->flush();
  }
  io::EmbeddingMeta meta;
  meta.num_rows = table_.size(0);
  meta.dim = table_.size(1);
  meta.dtype = table_.scalar_type();
  meta.optimizer = optimizer_;
  meta.options = options_.copy();
  meta.step = step_;
  meta.state_width = state_.defined() ? state_.size(1) : 0;
  meta.state_beside_rows = false;
  io::write_embedding_meta(files_path_, meta, table_, state_);
}

}  // namespace speedtorch

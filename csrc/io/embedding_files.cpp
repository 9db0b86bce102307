// A table and its optimizer state as .npy files plus a JSON meta file (see embedding_files.h).
#include "io/embedding_files.h"

#include <c10/util/Exception.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include "io/atomic_file.h"
#include "io/content_hash.h"
#include "io/message_text.h"
#include "io/meta_json.h"
#include "io/npy_file.h"
#include "memory/pinned_host_buffer.h"

namespace speedtorch::io {
namespace {

constexpr const char* kFormat = "speedtorch.embedding";
constexpr int64_t kVersion = 1;
// The members of a version-1 meta file.
const char* const kMetaMembers[] = {"format",     "version",    "num_rows",  "dim",         "dtype",
                                    "table_file", "table_hash", "optimizer", "options",     "step",
                                    "state_file", "state_hash", "state_width", "state_beside_rows", "meta_hash"};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string base_name(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), "speedtorch: cannot read ", path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A member of the meta object, with an error naming the file and the member when it is missing or not of the type
// `has_type` (a MetaJson::is_* member) accepts.
const MetaJson& member(const MetaJson& meta, const std::string& key, bool (MetaJson::*has_type)() const noexcept,
                       const std::string& file) {
  const auto v = meta.find(key);
  TORCH_CHECK(v != meta.end(), "speedtorch: ", file, " lacks \"", key, "\"; it was not written by speedtorch's save()");
  TORCH_CHECK(((*v).*has_type)(), "speedtorch: ", file, ": \"", key, "\" has the wrong type");
  return *v;
}

const std::string& text_member(const MetaJson& meta, const std::string& key, const std::string& file) {
  return member(meta, key, &MetaJson::is_string, file).get_ref<const std::string&>();
}

int64_t integer(const MetaJson& meta, const std::string& key, const std::string& file) {
  const double v = member(meta, key, &MetaJson::is_number, file).get<double>();
  TORCH_CHECK(v >= 0 && v == std::floor(v) && v < 9.007199254740992e15, "speedtorch: ", file, ": \"", key,
              "\" must be a non-negative integer, got ", v);
  return static_cast<int64_t>(v);
}

// A content hash recorded in the meta file: 16 hex digits (hash_to_hex). An empty or malformed one would leave the
// data unverifiable, so the file is rejected rather than loaded unchecked.
std::string hash_member(const MetaJson& meta, const std::string& key, const std::string& file) {
  const std::string& h = text_member(meta, key, file);
  bool ok = h.size() == 16;
  for (const char c : h) ok = ok && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  TORCH_CHECK(ok, "speedtorch: ", file, ": \"", key, "\" must be a content hash of 16 hex digits, got \"", printable(h),
              "\"; the meta file is damaged");
  return h;
}

}  // namespace

// The descr a table of `dtype` is stored with must be the file's (bfloat16 travels as raw uint16 bits).
void check_table_header(const NpyHeader& h, const EmbeddingMeta& meta, const std::string& file,
                        const std::string& meta_file) {
  const std::vector<int64_t> want = {meta.num_rows, meta.dim};
  TORCH_CHECK(h.shape == want, "speedtorch: ", file, " holds an array of shape ", c10::IntArrayRef(h.shape), " but ",
              meta_file, " describes a ", meta.num_rows, " x ", meta.dim, " table (files from different saves?)");
  TORCH_CHECK(h.descr.substr(1) == npy_descr(meta.dtype).substr(1), "speedtorch: ", file, " holds ", h.descr,
              " data but ", meta_file, " describes a ", dtype_name(meta.dtype), " table (stored as ",
              npy_descr(meta.dtype), ")");
}

void check_state_header(const NpyHeader& h, const EmbeddingMeta& meta, const std::string& file) {
  const std::vector<int64_t> want = {meta.num_rows, meta.state_width};
  TORCH_CHECK(h.shape == want && h.dtype == at::kFloat, "speedtorch: ", file, " holds ", h.descr, " data of shape ",
              c10::IntArrayRef(h.shape), "; the optimizer state of this table is float32 of shape (", meta.num_rows,
              ", ", meta.state_width, ") (files from different saves?)");
}

namespace {

// The content of a JSON value as bytes that do not depend on how to_meta_json lays it out (indentation, number
// notation, which may change between versions): kinds, exact number bits (every number as the double it reads as,
// however the parser stores it), strings and keys with their lengths.
void append_canonical(const MetaJson& v, std::string& out) {
  const auto append_u64 = [&out](uint64_t x) { out.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
  switch (v.type()) {
    case MetaJson::value_t::null: out.push_back('n'); return;
    case MetaJson::value_t::boolean: out.push_back(v.get<bool>() ? 't' : 'f'); return;
    case MetaJson::value_t::number_integer:
    case MetaJson::value_t::number_unsigned:
    case MetaJson::value_t::number_float: {
      out.push_back('d');
      const double d = v.get<double>();
      uint64_t bits = 0x7FF8000000000000ull;  // every NaN reads back as this one ("NaN" in the file)
      if (!std::isnan(d)) std::memcpy(&bits, &d, sizeof(bits));
      append_u64(bits);
      return;
    }
    case MetaJson::value_t::string: {
      const std::string& text = v.get_ref<const std::string&>();
      out.push_back('s');
      append_u64(text.size());
      out += text;
      return;
    }
    case MetaJson::value_t::object:
      out.push_back('o');
      append_u64(v.size());
      for (const auto& m : v.items()) {
        append_u64(m.key().size());
        out += m.key();
        append_canonical(m.value(), out);
      }
      return;
    default:  // arrays are refused by parse_meta_json and never written
      TORCH_CHECK(false, "speedtorch: a meta file holds no ", v.type_name());
  }
}

// The hash of a meta file's members other than "meta_hash": a changed value (a flipped bit in the learning rate or
// the step count) changes it; the file's layout does not.
std::string meta_content_hash(const MetaJson& j) {
  std::string bytes;
  for (const auto& m : j.items()) {
    if (m.key() == "meta_hash") continue;
    MetaJson one = MetaJson::object();
    one[m.key()] = m.value();
    append_canonical(one, bytes);
  }
  return hash_to_hex(xxh64(bytes.data(), bytes.size(), 0));
}

// Members in the order meta files have always had them; every number a double (as it reads back).
MetaJson meta_json(const EmbeddingMeta& meta, const EmbeddingPaths& paths) {
  MetaJson j = MetaJson::object();
  j["format"] = kFormat;
  j["version"] = static_cast<double>(kVersion);
  j["num_rows"] = static_cast<double>(meta.num_rows);
  j["dim"] = static_cast<double>(meta.dim);
  j["dtype"] = dtype_name(meta.dtype);
  j["table_file"] = valid_utf8(base_name(paths.table));
  j["table_hash"] = meta.table_hash;
  j["optimizer"] = meta.optimizer;
  MetaJson options = MetaJson::object();
  for (const auto& entry : meta.options) options[entry.key()] = entry.value();
  j["options"] = std::move(options);
  j["step"] = static_cast<double>(meta.step);
  if (!meta.optimizer.empty()) {
    j["state_file"] = valid_utf8(base_name(paths.state));
    j["state_hash"] = meta.state_hash;
    j["state_width"] = static_cast<double>(meta.state_width);
    j["state_beside_rows"] = meta.state_beside_rows ? 1.0 : 0.0;
  }
  j["meta_hash"] = meta_content_hash(j);  // last: it covers every member before it
  return j;
}

void check_hash(const std::string& got, const std::string& expected, const std::string& file,
                const std::string& meta_file) {
  TORCH_CHECK(got == expected, "speedtorch: ", file, " does not match ", meta_file, " (content hash ", got,
              ", expected ", expected, "): the files come from different saves, e.g. a save interrupted between "
              "its renames, a file copied from another checkpoint, or a table opened with mode 'r+' and changed "
              "without flush(). Load with verify=False to accept the files as they are.");
}

}  // namespace

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    default: TORCH_CHECK(false, "speedtorch: tables are float32, float16 or bfloat16, got ", dtype);
  }
}

c10::ScalarType dtype_from_name(const std::string& name) {
  if (name == "float32") return c10::ScalarType::Float;
  if (name == "float16") return c10::ScalarType::Half;
  if (name == "bfloat16") return c10::ScalarType::BFloat16;
  TORCH_CHECK(false, "speedtorch: unknown table dtype '", printable(name), "' (float32, float16 or bfloat16)");
}

EmbeddingPaths embedding_paths(const std::string& path) {
  TORCH_CHECK(!path.empty(), "speedtorch: the path of a table's files is empty");
  const std::string stem = ends_with(path, ".npy") ? path.substr(0, path.size() - 4) : path;
  TORCH_CHECK(!stem.empty() && stem.back() != '/', "speedtorch: '", path, "' names a directory, not a table file");
  return {stem + ".npy", stem + ".state.npy", stem + ".meta.json"};
}

std::string content_hash_of(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.device().is_cpu() && tensor.is_contiguous(),
              "speedtorch: content_hash_of needs a dense host tensor");
  ContentHasher hasher;
  hasher.update(tensor.data_ptr(), static_cast<std::size_t>(tensor.nbytes()));
  return hash_to_hex(hasher.digest());
}

std::string content_hash_of_rows(const at::Tensor& rows) {
  TORCH_CHECK(rows.device().is_cpu() && rows.dim() == 2, "speedtorch: content_hash_of_rows needs a 2-D host tensor");
  if (rows.is_contiguous()) return content_hash_of(rows);
  // Strided rows (state beside them): hashed a contiguous chunk at a time, which gives the hash of the packed rows.
  constexpr int64_t kChunkBytes = int64_t{64} << 20;
  const int64_t row_bytes = std::max<int64_t>(1, rows.size(1) * static_cast<int64_t>(rows.element_size()));
  const int64_t chunk_rows = std::max<int64_t>(1, kChunkBytes / row_bytes);
  ContentHasher hasher;
  for (int64_t first = 0; first < rows.size(0); first += chunk_rows) {
    const at::Tensor chunk = rows.narrow(0, first, std::min(chunk_rows, rows.size(0) - first)).contiguous();
    hasher.update(chunk.data_ptr(), static_cast<std::size_t>(chunk.nbytes()));
  }
  return hash_to_hex(hasher.digest());
}

EmbeddingMeta save_embedding_files(const std::string& path, const at::Tensor& table, const at::Tensor& state,
                                   const std::string& optimizer, const c10::Dict<std::string, double>& options,
                                   int64_t step, bool state_beside_rows) {
  TORCH_CHECK(table.defined() && table.dim() == 2, "speedtorch.save: the table must be 2-D, got ",
              table.defined() ? table.sizes() : c10::IntArrayRef{});
  const EmbeddingPaths paths = embedding_paths(path);
  EmbeddingMeta meta;
  meta.num_rows = table.size(0);
  meta.dim = table.size(1);
  meta.dtype = table.scalar_type();
  (void)dtype_name(meta.dtype);  // float32, float16 or bfloat16 only
  meta.optimizer = optimizer;
  meta.options = options.copy();
  meta.step = step;
  meta.state_beside_rows = state_beside_rows;
  TORCH_CHECK(step >= 0, "speedtorch.save: step must be >= 0, got ", step);
  TORCH_CHECK(optimizer.empty() == !state.defined(), "speedtorch.save: an optimizer name needs its state and the "
              "state its name (got optimizer '", optimizer, "', state ", state.defined() ? "given" : "undefined", ")");
  if (state.defined()) {
    TORCH_CHECK(state.dim() == 2 && state.size(0) == meta.num_rows && state.scalar_type() == at::kFloat,
                "speedtorch.save: the optimizer state must be float32 of shape (", meta.num_rows, ", width), got ",
                state.scalar_type(), " ", state.sizes());
    meta.state_width = state.size(1);
  }
  // Every file reaches the disk under a temporary name before any is renamed; the meta goes last.
  NpyWriter table_writer(paths.table, meta.dtype, table.sizes().vec());
  table_writer.write(table);
  meta.table_hash = hash_to_hex(table_writer.finish());
  std::optional<NpyWriter> state_writer;
  if (state.defined()) {
    state_writer.emplace(paths.state, at::kFloat, state.sizes().vec());
    state_writer->write(state);
    meta.state_hash = hash_to_hex(state_writer->finish());
  }
  AtomicFile meta_file(paths.meta, "speedtorch.save");
  const std::string text = to_meta_json(meta_json(meta, paths));
  meta_file.write(text.data(), text.size());
  meta_file.finish();
  // The renames back to back, one directory sync after them: a process killed during a save leaves the previous
  // files unless it dies within these three system calls (then load() finds files of two saves and refuses them).
  table_writer.commit(/*sync_directory=*/false);
  if (state_writer) state_writer->commit(/*sync_directory=*/false);
  meta_file.commit();
  if (!state.defined() && file_exists(paths.state)) ::unlink(paths.state.c_str());  // a stale state of an older save
  meta.has_meta_file = true;
  return meta;
}

EmbeddingMeta read_embedding_meta(const std::string& path) {
  const EmbeddingPaths paths = embedding_paths(path);
  EmbeddingMeta meta;
  if (!file_exists(paths.meta)) {
    // A plain .npy: rows only.
    TORCH_CHECK(file_exists(paths.table), "speedtorch: no table at ", paths.table, " (and no ", paths.meta, ")");
    const NpyHeader h = read_npy_header(paths.table);
    TORCH_CHECK(h.shape.size() == 2, "speedtorch: ", paths.table, " holds an array of shape ",
                c10::IntArrayRef(h.shape), "; a table is 2-D (num_rows, dim)");
    TORCH_CHECK(h.dtype != at::kUInt16, "speedtorch: ", paths.table, " holds uint16 data; a bfloat16 table saved by "
                "speedtorch has its meta file ", paths.meta, " beside it: is it missing?");
    TORCH_CHECK(at::isFloatingType(h.dtype), "speedtorch: ", paths.table, " holds ", h.descr,
                " data; a table is floating point");
    meta.num_rows = h.shape[0];
    meta.dim = h.shape[1];
    meta.dtype = h.dtype == at::kDouble ? at::kFloat : h.dtype;  // float64 rows become float32
    return meta;
  }
  const MetaJson j = parse_meta_json(read_text(paths.meta), paths.meta);
  TORCH_CHECK(j.is_object(), "speedtorch: ", paths.meta, " is not a JSON object");
  // Meta files written before "meta_hash" existed have none and are read as they are, provided every member is
  // one they had (a damaged "meta_hash" key must not switch the check off).
  const auto recorded = j.find("meta_hash");
  if (recorded == j.end()) {
    for (const auto& m : j.items()) {
      TORCH_CHECK(std::find(std::begin(kMetaMembers), std::end(kMetaMembers), m.key()) != std::end(kMetaMembers),
                  "speedtorch: ", paths.meta, " has an unknown member \"", printable(m.key()), "\" and no "
                  "\"meta_hash\"; the meta file is damaged");
    }
  } else {
    const std::string expected = meta_content_hash(j);
    const std::string got = recorded->is_string() ? recorded->get<std::string>() : recorded->dump();
    TORCH_CHECK(recorded->is_string() && got == expected, "speedtorch: ", paths.meta,
                " is damaged: its content does not match its \"meta_hash\" (", printable(got),
                ", the content hashes to ", expected, "). Restore it from a backup or save the table again; after an "
                "edit by hand, delete the \"meta_hash\" line");
  }
  const std::string& format = text_member(j, "format", paths.meta);
  TORCH_CHECK(format == kFormat, "speedtorch: ", paths.meta, " is not a speedtorch table's meta file (format '",
              printable(format), "')");
  const int64_t version = integer(j, "version", paths.meta);
  TORCH_CHECK(version == kVersion, "speedtorch: ", paths.meta, " has format version ", version, "; this speedtorch "
              "reads version ", kVersion, " (written by a newer speedtorch? upgrade it)");
  meta.has_meta_file = true;
  meta.num_rows = integer(j, "num_rows", paths.meta);
  meta.dim = integer(j, "dim", paths.meta);
  meta.dtype = dtype_from_name(text_member(j, "dtype", paths.meta));
  meta.table_hash = hash_member(j, "table_hash", paths.meta);
  meta.optimizer = text_member(j, "optimizer", paths.meta);
  TORCH_CHECK(printable(meta.optimizer) == meta.optimizer, "speedtorch: ", paths.meta, ": \"optimizer\" is not an "
              "optimizer's name (\"", printable(meta.optimizer), "\"); the meta file is damaged");
  for (const auto& m : member(j, "options", &MetaJson::is_object, paths.meta).items()) {
    // Names reach the optimizer's parser, whose errors quote them: they must be printable.
    TORCH_CHECK(m.value().is_number() && printable(m.key()) == m.key(), "speedtorch: ", paths.meta, ": option '",
                printable(m.key()), "' must be a printable name with a number");
    meta.options.insert(m.key(), m.value().get<double>());
  }
  meta.step = integer(j, "step", paths.meta);
  TORCH_CHECK(file_exists(paths.table), "speedtorch: ", paths.meta, " describes a table whose rows file ",
              paths.table, " is missing");
  check_table_header(read_npy_header(paths.table), meta, paths.table, paths.meta);
  if (!meta.optimizer.empty()) {
    meta.state_hash = hash_member(j, "state_hash", paths.meta);
    meta.state_width = integer(j, "state_width", paths.meta);
    meta.state_beside_rows = integer(j, "state_beside_rows", paths.meta) != 0;
    TORCH_CHECK(file_exists(paths.state), "speedtorch: ", paths.meta, " describes a table trained with ",
                meta.optimizer, " whose optimizer state file ", paths.state, " is missing");
    check_state_header(read_npy_header(paths.state), meta, paths.state);
  }
  return meta;
}

void load_embedding_files(const std::string& path, const EmbeddingMeta& meta, const at::Tensor& table,
                          const at::Tensor& state, bool verify) {
  const EmbeddingPaths paths = embedding_paths(path);
  TORCH_CHECK(table.defined() && table.dim() == 2 && table.size(0) == meta.num_rows && table.size(1) == meta.dim,
              "speedtorch.load: the destination table must be ", meta.num_rows, " x ", meta.dim);
  check_host_memory_writable(table, "speedtorch.load", "the destination table");
  check_host_memory_writable(state, "speedtorch.load", "the destination optimizer state");
  NpyReader table_reader(paths.table);
  table_reader.read(table);
  if (verify && !meta.table_hash.empty()) {
    check_hash(hash_to_hex(table_reader.hash()), meta.table_hash, paths.table, paths.meta);
  }
  if (meta.optimizer.empty()) return;
  TORCH_CHECK(state.defined() && state.dim() == 2 && state.size(0) == meta.num_rows &&
                  state.size(1) == meta.state_width,
              "speedtorch.load: the destination state must be ", meta.num_rows, " x ", meta.state_width);
  NpyReader state_reader(paths.state);
  state_reader.read(state);
  if (verify) check_hash(hash_to_hex(state_reader.hash()), meta.state_hash, paths.state, paths.meta);
}

void write_embedding_meta(const std::string& path, EmbeddingMeta meta, const at::Tensor& table,
                          const at::Tensor& state) {
  const EmbeddingPaths paths = embedding_paths(path);
  meta.table_hash = content_hash_of(table);
  if (state.defined()) meta.state_hash = content_hash_of(state);
  write_file_atomically(paths.meta, to_meta_json(meta_json(meta, paths)), "speedtorch.flush");
}

}  // namespace speedtorch::io

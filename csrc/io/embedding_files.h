// A table and its optimizer state on disk, as files NumPy reads and writes. For a path "users.npy":
//
//   users.npy         the rows: (num_rows, dim) in the table's dtype (bfloat16 as raw '<u2' bits)
//   users.state.npy   the optimizer state: (num_rows, state_width) float32, each row a 4-float header (the row's
//                     step count as int32 bits) and the optimizer's vectors (csrc/core/row_optimizer_math.h);
//                     only when there is an optimizer
//   users.meta.json   dtype, optimizer name and options, table-wide step count, the content hash of each file, and
//                     "meta_hash", a hash of the meta's own other members (a damaged value is an error, not a
//                     silently different learning rate); meta files without it (older saves) are read unchecked
//
// Saving writes every file to a temporary beside it, flushes them all to disk, then renames them into place back to
// back (the meta last) and syncs the directory: a crash mid-save leaves the old files. Loading checks the shapes
// and dtypes against the meta and, as the data streams in, the content hashes: files from different saves (a crash
// within the renames, a file copied from elsewhere) are an error, never a silent mix. A plain 2-D .npy without a
// meta file loads as rows only. docs/reliability.md lists what each guarantee rests on and the tests that prove it.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "io/npy_file.h"

namespace speedtorch::io {

struct EmbeddingPaths {
  std::string table;
  std::string state;
  std::string meta;
};

// The three file names for `path` ("users" and "users.npy" both give users.npy, users.state.npy, users.meta.json).
EmbeddingPaths embedding_paths(const std::string& path);

struct EmbeddingMeta {
  int64_t num_rows = 0;
  int64_t dim = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::string optimizer;  // "" when there is none
  c10::Dict<std::string, double> options;
  int64_t step = 0;
  int64_t state_width = 0;  // 0 when there is no optimizer
  bool state_beside_rows = true;
  std::string table_hash;  // 16 hex digits; "" when unknown (a plain .npy)
  std::string state_hash;
  bool has_meta_file = false;
};

// Saves `table` (num_rows x dim, any device and strides) and `state` (num_rows x width float32, or undefined when
// there is no optimizer). Returns what the meta file now says (hashes included).
EmbeddingMeta save_embedding_files(const std::string& path, const at::Tensor& table, const at::Tensor& state,
                                   const std::string& optimizer, const c10::Dict<std::string, double>& options,
                                   int64_t step, bool state_beside_rows);

// Reads the meta file (or, without one, describes the plain .npy table) and checks the .npy headers against it.
EmbeddingMeta read_embedding_meta(const std::string& path);

// Check a .npy header (`file`'s) against what the meta says the table's rows file / optimizer state file hold:
// shape and stored type; an error names both files ("files from different saves?").
void check_table_header(const NpyHeader& h, const EmbeddingMeta& meta, const std::string& file,
                        const std::string& meta_file);
void check_state_header(const NpyHeader& h, const EmbeddingMeta& meta, const std::string& file);

// Streams the files into `table` and `state` (shapes as the meta; `state` undefined when there is no optimizer),
// checking the content hashes against the meta when `verify`.
void load_embedding_files(const std::string& path, const EmbeddingMeta& meta, const at::Tensor& table,
                          const at::Tensor& state, bool verify);

// Rewrites only the meta file (atomically), e.g. after a memory-mapped table changed in place; the hashes are
// computed from the tensors given (dense host memory: the mapped files themselves).
void write_embedding_meta(const std::string& path, EmbeddingMeta meta, const at::Tensor& table,
                          const at::Tensor& state);

// The content hash (io/content_hash.h) of a dense host tensor's bytes, as hex.
std::string content_hash_of(const at::Tensor& tensor);
// The content hash of a 2-D host tensor's rows packed one after the other (what a save writes and records, whatever
// the row stride), as hex.
std::string content_hash_of_rows(const at::Tensor& rows);

// The dtype's name in meta files and pickled models ("float32", "float16", "bfloat16"), and back.
std::string dtype_name(c10::ScalarType dtype);
c10::ScalarType dtype_from_name(const std::string& name);

}  // namespace speedtorch::io

// .npy files (NumPy's format, versions 1.0 to 3.0), in C++ so a process without Python (a TorchScript server) can
// save and load tables: header parsing with validation, header writing, and the streaming of a tensor's rows into
// and out of the data region in bounded chunks, so no second table-sized copy exists in RAM or on a GPU.
//
// - Reads go straight into the destination's memory when its rows are dense host memory of the file's type
//   (e.g. a pinned table); otherwise through one chunk-sized staging buffer (pinned for a GPU destination).
// - Writes are atomic (io/atomic_file.h): a crash mid-save leaves the old file intact.
// - Every byte of data is fed to a ContentHasher on the way (io/content_hash.h), for the callers that check files
//   against a recorded hash.
//
// Types: float16/32/64, int8/16/32/64, uint8, uint16 and bool, little-endian, C order. bfloat16, which NumPy lacks,
// is stored as its raw bits ('<u2'); such a file loads back into a bfloat16 tensor bit for bit.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/write_cancellation.h"
#include "io/content_hash.h"

namespace speedtorch::io {

// Rows moved per read or write (the staging buffer's size): large enough to keep a disk busy.
constexpr int64_t kDefaultChunkBytes = int64_t{64} << 20;

struct NpyHeader {
  std::string descr;                // as written in the file, e.g. "<f4"
  c10::ScalarType dtype;            // the tensor type of the data
  std::vector<int64_t> shape;
  int64_t data_offset = 0;          // where the data starts in the file
  int64_t numel() const;
  int64_t data_bytes() const;
};

// The .npy type string for a dtype ("<f4", ...; bfloat16 -> "<u2").
std::string npy_descr(c10::ScalarType dtype);

// The header bytes for an array of `dtype` and `shape`: magic, version (1.0, or 2.0 for huge headers), the header
// dict, padded with spaces so the data starts on a 64-byte boundary, as NumPy writes it.
std::string encode_npy_header(c10::ScalarType dtype, c10::IntArrayRef shape);

// Parses and validates a header held in memory: `bytes` are the file's first `size` bytes (at least the whole
// header). `name` names the file in error messages.
NpyHeader parse_npy_header(const char* bytes, std::size_t size, const std::string& name);

// Reads and validates the header of the file at `path`, and checks that the file holds exactly the data the header
// announces (a shorter file is reported as truncated).
NpyHeader read_npy_header(const std::string& path);

// The same for a file mapped in memory (`bytes`: the whole file, `size` bytes): a mapping is described by its own
// bytes, never by an earlier read of the path, which a save may have replaced in between.
NpyHeader mapped_npy_header(const void* bytes, std::size_t size, const std::string& name);

// Writes one .npy file through a temporary beside `path`: write() the rows in order, finish() to flush them to
// disk, commit() to rename the file into place. Destroyed before commit(), the temporary is removed and the target
// is untouched.
class NpyWriter {
 public:
  NpyWriter(std::string path, c10::ScalarType dtype, std::vector<int64_t> shape,
            int64_t chunk_bytes = kDefaultChunkBytes);
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  // The next rows (leading dimension) of the array: a tensor of the writer's dtype whose trailing dimensions match
  // the shape, on any device, with any strides.
  void write(const at::Tensor& rows);
  // Checks every row was written, fsyncs and closes the temporary; returns the content hash of the data.
  uint64_t finish();
  // Renames the finished temporary over the target and (unless told not to) fsyncs the directory.
  void commit(bool sync_directory = true);
  int64_t rows_written() const { return rows_written_; }

 private:
  void write_bytes(const void* data, std::size_t size);

  std::string path_;
  c10::ScalarType dtype_;
  std::vector<int64_t> shape_;
  int64_t chunk_bytes_;
  int64_t row_bytes_ = 0;
  int64_t rows_total_ = 0;
  int64_t rows_written_ = 0;
  bool finished_ = false;
  AtomicFile file_;
  ContentHasher hasher_;
  at::Tensor staging_;
  WriteCancellation cancellation_;  // checked between chunks
};

// Reads one .npy file's rows in order into tensors, through staging only where needed.
class NpyReader {
 public:
  explicit NpyReader(std::string path, int64_t chunk_bytes = kDefaultChunkBytes);
  ~NpyReader();
  NpyReader(const NpyReader&) = delete;
  NpyReader& operator=(const NpyReader&) = delete;

  const NpyHeader& header() const { return header_; }
  // Reads the next dst.size(0) rows into `dst`: any device and strides, trailing dimensions as the file's. The
  // file's type is converted when both are floating point (float64 -> float32, ...); '<u2' data goes into a
  // bfloat16 tensor as raw bits; any other mismatch is an error.
  void read(const at::Tensor& dst);
  int64_t rows_read() const { return rows_read_; }
  // The content hash of the data read so far (of the whole data once every row was read).
  uint64_t hash() const { return hasher_.digest(); }

 private:
  void read_bytes(void* data, std::size_t size);

  std::string path_;
  NpyHeader header_;
  int64_t chunk_bytes_;
  int64_t row_bytes_ = 0;
  int64_t rows_total_ = 0;
  int64_t rows_read_ = 0;
  int fd_ = -1;
  ContentHasher hasher_;
  at::Tensor staging_;
};

// Saves `tensor` (any shape, device and strides) to `path` atomically; returns the content hash of the data.
uint64_t save_npy(const at::Tensor& tensor, const std::string& path);
// Loads the whole file into `dst`, whose shape must be the file's (types as NpyReader::read); returns the hash.
uint64_t load_npy_into(const at::Tensor& dst, const std::string& path);
// A new tensor holding the file: in exact-size pinned memory when `pinned` (else ordinary host memory), read
// straight into it.
at::Tensor load_npy(const std::string& path, bool pinned);

// Creates a new .npy file of zeros at `path` (which must not exist): the header, then the file extended to its full
// size with its blocks allocated (posix_fallocate: zeros, not written), so that a file system without room for it
// refuses here rather than the process dying of SIGBUS at a later write into the mapping. Returns the header. For
// tables mapped in place (PinnedEmbedding::create).
NpyHeader create_zero_npy(const std::string& path, c10::ScalarType dtype, c10::IntArrayRef shape);

}  // namespace speedtorch::io

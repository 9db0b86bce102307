// .npy header codec and chunked, atomic streaming of tensors to and from .npy files (see npy_file.h).
#include "io/npy_file.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <sstream>

#include "io/file_mode.h"
#include "io/mapped_file_guard.h"
#include "io/message_text.h"
#include "io/progress_meter.h"
#include "memory/pinned_host_buffer.h"
#include "memory/host_access_tracker.h"

namespace speedtorch::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicLen = 6;
// A header longer than this is a corrupt length field, not a real header (NumPy's own limit is 10,000 bytes).
constexpr std::size_t kMaxHeaderLen = std::size_t{1} << 20;

struct TypeCode {
  char kind;
  int size;
  c10::ScalarType dtype;
};

constexpr TypeCode kTypes[] = {
    {'f', 2, c10::ScalarType::Half},  {'f', 4, c10::ScalarType::Float}, {'f', 8, c10::ScalarType::Double},
    {'i', 1, c10::ScalarType::Char},  {'i', 2, c10::ScalarType::Short}, {'i', 4, c10::ScalarType::Int},
    {'i', 8, c10::ScalarType::Long},  {'u', 1, c10::ScalarType::Byte},  {'u', 2, c10::ScalarType::UInt16},
    {'b', 1, c10::ScalarType::Bool},
};
constexpr const char* kSupportedTypes = "f2, f4, f8, i1, i2, i4, i8, u1, u2, b1";

[[noreturn]] void header_error(const std::string& name, const std::string& what) {
  TORCH_CHECK(false, "speedtorch npy: ", name, ": ", what);
}

// The Python-literal dict of a .npy header: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }.
class HeaderDictParser {
 public:
  HeaderDictParser(const std::string& text, const std::string& name) : s_(text), name_(name) {}

  void parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        skip_space();
        if (peek() == '[') {
          fail("structured (record) dtypes are not supported; save a plain numeric array");
        }
        descr = string_literal();
        seen_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        seen_fortran = true;
      } else if (key == "shape") {
        shape = int_tuple();
        seen_shape = true;
      } else {
        fail("unexpected key '" + printable(key) + "' in the header (expected descr, fortran_order, shape)");
      }
      skip_space();
      if (peek() == ',') ++i_;
    }
    if (!seen_descr || !seen_fortran || !seen_shape) {
      fail("the header lacks one of 'descr', 'fortran_order', 'shape'");
    }
    ++i_;  // '}'
    skip_space();  // NumPy pads the header with spaces up to its closing newline
    if (i_ != s_.size()) fail("malformed header: text after the closing '}' at offset " + std::to_string(i_));
  }

 private:
  [[noreturn]] void fail(const std::string& what) { header_error(name_, what); }

  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("malformed header: expected '") + c + "' at offset " + std::to_string(i_));
    ++i_;
  }
  std::string string_literal() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("malformed header: expected a quoted string at offset " + std::to_string(i_));
    const std::size_t end = s_.find(quote, i_ + 1);
    if (end == std::string::npos) fail("malformed header: unterminated string");
    std::string out = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_space();
    if (s_.compare(i_, 4, "True") == 0) return i_ += 4, true;
    if (s_.compare(i_, 5, "False") == 0) return i_ += 5, false;
    fail("malformed header: fortran_order must be True or False");
  }
  std::vector<int64_t> int_tuple() {
    expect('(');
    std::vector<int64_t> out;
    while (true) {
      skip_space();
      if (peek() == ')') {
        ++i_;
        return out;
      }
      if (peek() < '0' || peek() > '9') fail("malformed header: shape must be a tuple of non-negative integers");
      // Python (and so NumPy) rejects leading zeros: "08" is a damaged digit, not 8.
      if (peek() == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9') {
        fail("malformed header: a size of the shape has a leading zero");
      }
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        const int digit = peek() - '0';
        if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("a dimension of the shape overflows");
        v = v * 10 + digit;
        ++i_;
      }
      if (peek() == 'L') ++i_;  // Python 2 longs
      out.push_back(v);
      skip_space();
      if (peek() == ',') {
        ++i_;
      } else if (peek() != ')') {
        fail("malformed header: shape must be a tuple of non-negative integers");
      }
    }
  }

  const std::string& s_;
  const std::string& name_;
  std::size_t i_ = 0;
};

c10::ScalarType dtype_of_descr(const std::string& descr, const std::string& name) {
  // Exactly byte order, kind and a one-digit size ("<f4"), as NumPy writes every type we read: a lenient number
  // parse would accept "<f4" followed by anything and describe a type the bytes do not name.
  if (descr.size() != 3 || descr[2] < '1' || descr[2] > '9') {
    header_error(name, "unsupported dtype '" + printable(descr) + "'; supported: " + kSupportedTypes +
                           " (little-endian); bfloat16 is stored as u2");
  }
  const char order = descr[0];
  const char kind = descr[1];
  const int size = descr[2] - '0';
  if (order == '>' && size > 1) {
    header_error(name, "big-endian data ('" + printable(descr) + "') is not supported; convert it in NumPy with "
                           "a.astype('<" + printable(descr.substr(1)) + "') and save again");
  }
  if (order != '<' && order != '|' && order != '=' && order != '>') {
    header_error(name, "unsupported dtype '" + printable(descr) + "'");
  }
  for (const auto& t : kTypes) {
    if (t.kind == kind && t.size == size) return t.dtype;
  }
  header_error(name, "unsupported dtype '" + printable(descr) + "'; supported: " + kSupportedTypes +
                         " (little-endian); bfloat16 is stored as u2");
}

uint32_t little_endian(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A raw copy moves bytes: both sides are viewed as an integer type of the element's size.
at::Tensor as_bits(const at::Tensor& t) {
  switch (t.element_size()) {
    case 1: return t.view(at::kByte);
    case 2: return t.view(at::kShort);
    case 4: return t.view(at::kInt);
    default: return t.view(at::kLong);
  }
}

int64_t trailing_numel(c10::IntArrayRef shape) {
  int64_t n = 1;
  for (std::size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

// Rows of an array: the leading dimension (a 0-d array is one row).
at::Tensor as_rows(const at::Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

void check_row_shape(const at::Tensor& rows, const std::vector<int64_t>& shape, const std::string& what,
                     const std::string& name) {
  const std::size_t rank = shape.empty() ? 1 : shape.size();
  bool ok = static_cast<std::size_t>(rows.dim()) == rank;
  for (std::size_t d = 1; ok && d < rank; ++d) ok = rows.size(static_cast<int64_t>(d)) == shape[d];
  TORCH_CHECK(ok, what, ": ", name, " holds an array of shape ", c10::IntArrayRef(shape), "; rows of shape ",
              rows.sizes(), " do not fit it (trailing dimensions must match)");
}

at::Tensor staging_for(const at::Tensor& like_rows, c10::ScalarType dtype, int64_t rows, bool for_gpu) {
  std::vector<int64_t> sizes(like_rows.sizes().begin(), like_rows.sizes().end());
  sizes[0] = rows;
  // Pinned staging lets the GPU side of the copy run at the link's speed.
  if (for_gpu && cuda_device_available()) return pinned_empty(sizes, dtype);
  return at::empty(sizes, at::TensorOptions().dtype(dtype));
}

// The file must hold exactly the data its header announces.
void check_npy_file_size(const NpyHeader& h, int64_t file_size, const std::string& path) {
  const int64_t expected = h.data_offset + h.data_bytes();
  TORCH_CHECK(file_size >= expected, "speedtorch npy: ", path, " is truncated: its header announces ",
              h.data_bytes(), " bytes of data (shape ", c10::IntArrayRef(h.shape), ", ", h.descr, ") but the file "
              "holds only ", file_size - h.data_offset, " (was a save interrupted?)");
  TORCH_CHECK(file_size == expected, "speedtorch npy: ", path, " has ", file_size - expected,
              " bytes after the data its header announces (shape ", c10::IntArrayRef(h.shape), ", ", h.descr,
              "); the header does not describe this file");
}

}  // namespace

int64_t NpyHeader::numel() const {
  int64_t n = 1;
  for (const int64_t s : shape) n *= s;
  return n;
}

int64_t NpyHeader::data_bytes() const { return numel() * static_cast<int64_t>(c10::elementSize(dtype)); }

std::string npy_descr(c10::ScalarType dtype) {
  if (dtype == at::kBFloat16) return "<u2";
  for (const auto& t : kTypes) {
    if (t.dtype == dtype) return std::string(t.size == 1 ? "|" : "<") + t.kind + std::to_string(t.size);
  }
  TORCH_CHECK(false, "speedtorch npy: dtype ", dtype, " cannot be stored in a .npy file; supported: float16, "
              "bfloat16, float32, float64, int8, int16, int32, int64, uint8, uint16, bool");
}

std::string encode_npy_header(c10::ScalarType dtype, c10::IntArrayRef shape) {
  std::ostringstream dict;
  dict << "{'descr': '" << npy_descr(dtype) << "', 'fortran_order': False, 'shape': (";
  for (std::size_t d = 0; d < shape.size(); ++d) {
    TORCH_CHECK(shape[d] >= 0, "speedtorch npy: negative dimension in shape ", shape);
    dict << shape[d] << (shape.size() == 1 ? "," : d + 1 < shape.size() ? ", " : "");
  }
  dict << "), }";
  std::string text = dict.str();
  // Padded with spaces and ended by a newline so that the data starts on a 64-byte boundary.
  const bool v1 = text.size() + 1 + kMagicLen + 4 <= 65535;
  const std::size_t preamble = kMagicLen + 2 + (v1 ? 2 : 4);
  const std::size_t total = (preamble + text.size() + 1 + 63) / 64 * 64;
  text.append(total - preamble - text.size() - 1, ' ');
  text.push_back('\n');
  std::string out(kMagic, kMagicLen);
  out.push_back(static_cast<char>(v1 ? 1 : 2));
  out.push_back(0);
  const std::size_t len = text.size();
  for (int i = 0; i < (v1 ? 2 : 4); ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  return out + text;
}

NpyHeader parse_npy_header(const char* bytes, std::size_t size, const std::string& name) {
  const auto* u = reinterpret_cast<const unsigned char*>(bytes);
  if (size < kMagicLen + 2 || std::memcmp(bytes, kMagic, kMagicLen) != 0) {
    header_error(name, size < kMagicLen + 2 ? "too short to be a .npy file"
                                            : "not a .npy file (it does not start with \\x93NUMPY)");
  }
  const int major = u[6];
  const int minor = u[7];
  if (major < 1 || major > 3 || minor != 0) {
    header_error(name, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                           " (1.0, 2.0 and 3.0 are supported)");
  }
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (size < kMagicLen + 2 + len_bytes) header_error(name, "truncated header");
  const std::size_t header_len = little_endian(u + kMagicLen + 2, static_cast<int>(len_bytes));
  if (header_len > kMaxHeaderLen) header_error(name, "implausible header length " + std::to_string(header_len));
  const std::size_t start = kMagicLen + 2 + len_bytes;
  if (size < start + header_len) {
    header_error(name, "truncated header (the file ends before its " + std::to_string(header_len) + "-byte header)");
  }
  NpyHeader h;
  bool fortran = false;
  const std::string text(bytes + start, header_len);
  HeaderDictParser(text, name).parse(h.descr, fortran, h.shape);
  h.dtype = dtype_of_descr(h.descr, name);
  if (fortran && h.shape.size() > 1) {
    header_error(name, "the array is stored in Fortran (column-major) order; save np.ascontiguousarray(a) instead");
  }
  h.data_offset = static_cast<int64_t>(start + header_len);
  // Every partial product of the non-zero sizes must fit (with room for the element size): readers multiply the
  // trailing sizes into a row's bytes even when a leading size of 0 makes the array empty.
  int64_t n = 1;
  for (const int64_t s : h.shape) {
    if (s == 0) continue;
    if (n > std::numeric_limits<int64_t>::max() / 16 / s) {
      header_error(name, "the shape " + c10::str(c10::IntArrayRef(h.shape)) + " overflows");
    }
    n *= s;
  }
  return h;
}

namespace {

// The header of the file open on `fd` (named `path` in errors), read and validated through that descriptor.
NpyHeader read_npy_header_of(int fd, const std::string& path) {
  struct stat st {};
  std::string head(kMagicLen + 2 + 4, '\0');
  const ssize_t got = ::pread(fd, head.data(), head.size(), 0);
  const int err = errno;
  TORCH_CHECK(got >= 0 && ::fstat(fd, &st) == 0, "speedtorch npy: cannot read ", path, ": ", std::strerror(err));
  head.resize(static_cast<std::size_t>(got));
  // The first bytes give the header's length; then read the whole header.
  std::size_t need = head.size();
  if (head.size() >= kMagicLen + 2 && std::memcmp(head.data(), kMagic, kMagicLen) == 0) {
    const int major = static_cast<unsigned char>(head[6]);
    const std::size_t len_bytes = major == 1 ? 2 : 4;
    if (head.size() >= kMagicLen + 2 + len_bytes) {
      const std::size_t len =
          little_endian(reinterpret_cast<const unsigned char*>(head.data()) + kMagicLen + 2, static_cast<int>(len_bytes));
      need = std::min<std::size_t>(kMagicLen + 2 + len_bytes + std::min(len, kMaxHeaderLen + 1),
                                   static_cast<std::size_t>(st.st_size));
    }
  }
  if (need > head.size()) {
    head.resize(need);
    const ssize_t more = ::pread(fd, head.data(), need, 0);
    head.resize(more < 0 ? 0 : static_cast<std::size_t>(more));
  }
  NpyHeader h = parse_npy_header(head.data(), head.size(), path);
  check_npy_file_size(h, st.st_size, path);
  return h;
}

}  // namespace

NpyHeader read_npy_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "speedtorch npy: cannot open ", path, ": ", std::strerror(errno));
  try {
    NpyHeader h = read_npy_header_of(fd, path);
    ::close(fd);
    return h;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

NpyHeader mapped_npy_header(const void* bytes, std::size_t size, const std::string& name) {
  NpyHeader h = parse_npy_header(static_cast<const char*>(bytes), size, name);
  check_npy_file_size(h, static_cast<int64_t>(size), name);
  return h;
}

// --- NpyWriter ------------------------------------------------------------------------------------------------

NpyWriter::NpyWriter(std::string path, c10::ScalarType dtype, std::vector<int64_t> shape, int64_t chunk_bytes)
    : path_(std::move(path)),
      dtype_(dtype),
      shape_(std::move(shape)),
      chunk_bytes_(chunk_bytes),
      file_(path_, "speedtorch.save_npy") {
  TORCH_CHECK(chunk_bytes_ > 0, "speedtorch.save_npy: chunk_bytes must be > 0, got ", chunk_bytes_);
  rows_total_ = shape_.empty() ? 1 : shape_[0];
  row_bytes_ = trailing_numel(shape_) * static_cast<int64_t>(c10::elementSize(dtype_));
  const std::string header = encode_npy_header(dtype_, shape_);
  file_.write(header.data(), header.size());
}

NpyWriter::~NpyWriter() = default;

void NpyWriter::write_bytes(const void* data, std::size_t size) {
  hasher_.update(data, size);
  file_.write(data, size);
}

void NpyWriter::write(const at::Tensor& tensor) {
  TORCH_CHECK(!finished_, "speedtorch.save_npy: write() after finish()");
  TORCH_CHECK(tensor.defined(), "speedtorch.save_npy: the tensor to write is undefined");
  TORCH_CHECK(tensor.scalar_type() == dtype_, "speedtorch.save_npy: ", path_, " holds ", dtype_, "; got rows of ",
              tensor.scalar_type());
  const at::Tensor rows = as_rows(tensor);
  check_row_shape(rows, shape_, "speedtorch.save_npy", path_);
  const int64_t count = rows.size(0);
  TORCH_CHECK(rows_written_ + count <= rows_total_, "speedtorch.save_npy: ", path_, " holds ", rows_total_,
              " rows; ", rows_written_, " were written and ", count, " more do not fit");
  if (row_bytes_ == 0 || count == 0) {
    rows_written_ += count;
    return;
  }
  ProgressMeter meter("saving " + path_, count * row_bytes_);
  const int64_t chunk_rows = std::max<int64_t>(1, chunk_bytes_ / row_bytes_);
  for (int64_t first = 0; first < count; first += chunk_rows) {
    cancellation_.check(path_);
    const int64_t n = std::min(chunk_rows, count - first);
    const at::Tensor part = rows.narrow(0, first, n);
    if (part.device().is_cpu() && part.is_contiguous()) {
      write_bytes(part.data_ptr(), static_cast<std::size_t>(n * row_bytes_));
    } else {
      if (!staging_.defined() || staging_.size(0) < n) {
        staging_ = staging_for(rows, dtype_, std::min(chunk_rows, count), part.is_cuda());
      }
      at::Tensor stage = staging_.narrow(0, 0, n);
      as_bits(stage).copy_(as_bits(part));
      write_bytes(stage.data_ptr(), static_cast<std::size_t>(n * row_bytes_));
    }
    meter.advance(n * row_bytes_);
  }
  rows_written_ += count;
}

uint64_t NpyWriter::finish() {
  TORCH_CHECK(!finished_, "speedtorch.save_npy: finish() called twice");
  cancellation_.check(path_);
  TORCH_CHECK(rows_written_ == rows_total_, "speedtorch.save_npy: ", path_, " holds ", rows_total_, " rows but only ",
              rows_written_, " were written");
  file_.finish();
  finished_ = true;
  return hasher_.digest();
}

void NpyWriter::commit(bool sync_directory) { file_.commit(sync_directory); }

// --- NpyReader ------------------------------------------------------------------------------------------------

NpyReader::NpyReader(std::string path, int64_t chunk_bytes) : path_(std::move(path)), chunk_bytes_(chunk_bytes) {
  TORCH_CHECK(chunk_bytes_ > 0, "speedtorch.load_npy: chunk_bytes must be > 0, got ", chunk_bytes_);
  // Opened once: the header and the data come from one file, even when a save replaces the path meanwhile.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd_ >= 0, "speedtorch npy: cannot open ", path_, ": ", std::strerror(errno));
  try {
    header_ = read_npy_header_of(fd_, path_);
  } catch (...) {  // a constructor that throws runs no destructor
    ::close(fd_);
    throw;
  }
  rows_total_ = header_.shape.empty() ? 1 : header_.shape[0];
  row_bytes_ = trailing_numel(header_.shape) * static_cast<int64_t>(c10::elementSize(header_.dtype));
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

NpyReader::~NpyReader() {
  if (fd_ >= 0) ::close(fd_);
}

void NpyReader::read_bytes(void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  off_t offset = header_.data_offset + rows_read_ * row_bytes_;
  std::size_t left = size;
  while (left > 0) {
    const ssize_t n = ::pread(fd_, p, std::min<std::size_t>(left, std::size_t{1} << 30), offset);
    if (n < 0 && errno == EINTR) continue;
    TORCH_CHECK(n >= 0, "speedtorch.load_npy: reading ", path_, " failed: ", std::strerror(errno));
    TORCH_CHECK(n > 0, "speedtorch.load_npy: ", path_, " ended early (it shrank while being read)");
    p += n;
    offset += n;
    left -= static_cast<std::size_t>(n);
  }
  hasher_.update(data, size);
}

void NpyReader::read(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.defined(), "speedtorch.load_npy: the destination tensor is undefined");
  const at::Tensor rows = as_rows(tensor);
  check_row_shape(rows, header_.shape, "speedtorch.load_npy", path_);
  const c10::ScalarType dst = rows.scalar_type();
  const bool raw = dst == header_.dtype || (header_.dtype == at::kUInt16 && dst == at::kBFloat16);
  const bool convert = !raw && at::isFloatingType(dst) && at::isFloatingType(header_.dtype);
  TORCH_CHECK(raw || convert, "speedtorch.load_npy: ", path_, " holds ", header_.descr, " data (", header_.dtype,
              "), which cannot be loaded into a ", dst, " tensor; only floating types convert into each other");
  const int64_t count = rows.size(0);
  TORCH_CHECK(rows_read_ + count <= rows_total_, "speedtorch.load_npy: ", path_, " holds ", rows_total_, " rows; ",
              rows_read_, " were read and ", count, " more were asked for");
  if (row_bytes_ == 0 || count == 0) {
    rows_read_ += count;
    return;
  }
  ProgressMeter meter("loading " + path_, count * row_bytes_);
  const int64_t chunk_rows = std::max<int64_t>(1, chunk_bytes_ / row_bytes_);
  for (int64_t first = 0; first < count; first += chunk_rows) {
    const int64_t n = std::min(chunk_rows, count - first);
    at::Tensor part = rows.narrow(0, first, n);
    const auto bytes = static_cast<std::size_t>(n * row_bytes_);
    if (raw && part.device().is_cpu() && part.is_contiguous()) {
      read_bytes(part.data_ptr(), bytes);  // straight into the destination (e.g. a pinned table)
    } else {
      if (!staging_.defined() || staging_.size(0) < n) {
        staging_ = staging_for(rows, header_.dtype, std::min(chunk_rows, count), part.is_cuda());
      }
      at::Tensor stage = staging_.narrow(0, 0, n);
      read_bytes(stage.data_ptr(), bytes);
      if (raw) {
        as_bits(part).copy_(as_bits(stage));
      } else {
        part.copy_(stage);
      }
    }
    rows_read_ += n;
    meter.advance(static_cast<int64_t>(bytes));
  }
}

// --- whole tensors --------------------------------------------------------------------------------------------

uint64_t save_npy(const at::Tensor& tensor, const std::string& path) {
  TORCH_CHECK(tensor.defined(), "speedtorch.save_npy: tensor is undefined");
  TORCH_CHECK(!path.empty(), "speedtorch.save_npy: path is empty");
  // Rows a GPU kernel is still writing into a pinned table must land before the file is written.
  if (tensor.device().is_cpu() && tensor.numel() > 0) {
    wait_for_uva_conflicts(tensor.storage().data(), UvaAccess::kRead);
  }
  // Onto the file this very tensor maps read-write: written back in place, not replaced (io/mapped_file_guard.h).
  if (saves_mapped_data_itself(path, tensor, "speedtorch.save_npy")) {
    flush_file_mapping_holding(tensor.data_ptr());
    ContentHasher hasher;
    hasher.update(tensor.data_ptr(), static_cast<std::size_t>(tensor.nbytes()));
    return hasher.digest();
  }
  NpyWriter writer(path, tensor.scalar_type(), tensor.sizes().vec());
  writer.write(tensor);
  const uint64_t hash = writer.finish();
  writer.commit();
  return hash;
}

uint64_t load_npy_into(const at::Tensor& dst, const std::string& path) {
  TORCH_CHECK(dst.defined(), "speedtorch.load_npy_into_: tensor is undefined");
  check_host_memory_writable(dst, "speedtorch.load_npy_into_", "tensor");
  NpyReader reader(path);
  TORCH_CHECK(dst.sizes() == c10::IntArrayRef(reader.header().shape), "speedtorch.load_npy_into_: ", path,
              " holds an array of shape ", c10::IntArrayRef(reader.header().shape), ", the tensor has shape ",
              dst.sizes());
  if (dst.device().is_cpu() && dst.numel() > 0) wait_for_uva_conflicts(dst.storage().data(), UvaAccess::kWrite);
  reader.read(dst);
  return reader.hash();
}

at::Tensor load_npy(const std::string& path, bool pinned) {
  NpyReader reader(path);
  const NpyHeader& h = reader.header();
  at::Tensor out = pinned ? pinned_empty(h.shape, h.dtype) : at::empty(h.shape, at::TensorOptions().dtype(h.dtype));
  reader.read(out);
  return out;
}

NpyHeader create_zero_npy(const std::string& path, c10::ScalarType dtype, c10::IntArrayRef shape) {
  const std::string header = encode_npy_header(dtype, shape);
  NpyHeader h = parse_npy_header(header.data(), header.size(), path);
  // O_EXCL: never truncate a file someone else's table lives in.
  const int fd = open_new_file(path);
  TORCH_CHECK(fd >= 0, "speedtorch: cannot create ", path, ": ", std::strerror(errno),
              errno == EEXIST ? " (remove it first, or open it with PinnedEmbedding.open)" : "");
  const auto bytes = static_cast<off_t>(h.data_offset + h.data_bytes());
  int err = ::write(fd, header.data(), header.size()) == static_cast<ssize_t>(header.size()) ? 0 : errno;
  // The blocks are allocated now, not at the first write of each page: a file system without room for the file
  // (a small tmpfs such as a container's /dev/shm, a full disk) refuses here, where a sparse file would let a later
  // write of a page it cannot hold kill the process with SIGBUS. (Reading a tmpfs file through a mapping allocates
  // its pages anyway, and the meta file's hashes read them all.)
  if (err == 0) err = ::posix_fallocate(fd, 0, bytes);
  if (err == EOPNOTSUPP || err == EINVAL) err = ::ftruncate(fd, bytes) == 0 ? 0 : errno;  // cannot reserve: sparse
  struct statvfs fs {};
  const bool known_free = err == ENOSPC && ::fstatvfs(fd, &fs) == 0;
  ::close(fd);
  if (err != 0) {
    ::unlink(path.c_str());
    TORCH_CHECK(false, "speedtorch: cannot create ", path, " (", bytes, " bytes): ", std::strerror(err),
                known_free ? " (" + std::to_string(fs.f_bavail * fs.f_frsize) + " bytes free there)" : std::string());
  }
  return h;
}

}  // namespace speedtorch::io

// libFuzzer target over the .npy header parser (csrc/io/npy_file.h: parse_npy_header), the code that reads the
// first bytes of every table, state and plain .npy file before anything is allocated from what they say. For any
// bytes it must either throw c10::Error (the file is rejected with a message, valid UTF-8 so that Python can show
// it) or return a header consistent with
// the bytes: the magic and version are there, the header fits in them, the type string is the dtype's, and the
// shape's sizes can be multiplied without overflow. Any other exception, a crash or a sanitizer report is a bug.
// Built and run by `make fuzz` (tests/fuzz/CMakeLists.txt); seeds in tests/fuzz/corpus/npy_header/.
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "io/npy_file.h"
#include "utf8_text.h"

namespace {

using speedtorch::io::NpyHeader;

[[noreturn]] void inconsistent(const char* what, const NpyHeader& h) {
  std::fprintf(stderr, "fuzz_npy_header: accepted a header that does not match its bytes: %s (descr '%s', "
               "offset %lld)\n", what, h.descr.c_str(), static_cast<long long>(h.data_offset));
  std::abort();
}

void check_consistent(const uint8_t* data, std::size_t size, const NpyHeader& h) {
  if (size < 10 || std::memcmp(data, "\x93NUMPY", 6) != 0) inconsistent("no magic", h);
  const int major = data[6];
  if (major < 1 || major > 3 || data[7] != 0) inconsistent("unsupported version", h);
  const std::size_t preamble = major == 1 ? 10 : 12;
  const std::size_t len = major == 1 ? (data[8] | data[9] << 8)
                                     : (static_cast<std::size_t>(data[8]) | data[9] << 8 | data[10] << 16 |
                                        static_cast<std::size_t>(data[11]) << 24);
  if (h.data_offset != static_cast<int64_t>(preamble + len) || static_cast<std::size_t>(h.data_offset) > size) {
    inconsistent("data offset is not where the header ends", h);
  }
  const std::string text(reinterpret_cast<const char*>(data) + preamble, len);
  if (text.find(h.descr) == std::string::npos) inconsistent("descr not in the header text", h);
  // The type string names exactly the dtype returned (bfloat16 never comes from a file: '<u2' is uint16).
  if (h.descr.size() < 2 || h.descr.substr(1) != speedtorch::io::npy_descr(h.dtype).substr(1)) {
    inconsistent("descr and dtype disagree", h);
  }
  // Every partial product of the sizes (the bytes of a row, of the whole array) fits in int64 with room for the
  // element size: readers multiply them without further checks.
  int64_t product = 1;
  for (const int64_t s : h.shape) {
    if (s < 0) inconsistent("negative size", h);
    if (s == 0) continue;
    if (product > std::numeric_limits<int64_t>::max() / 16 / s) inconsistent("sizes overflow", h);
    product *= s;
  }
  (void)h.data_bytes();
  // What we accept we can write back: encoding the header and parsing it again gives the same array description.
  const std::string again = speedtorch::io::encode_npy_header(h.dtype, h.shape);
  const NpyHeader back = speedtorch::io::parse_npy_header(again.data(), again.size(), "re-encoded");
  if (back.dtype != h.dtype || back.shape != h.shape) inconsistent("re-encoded header differs", h);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  NpyHeader h;
  try {
    h = speedtorch::io::parse_npy_header(reinterpret_cast<const char*>(data), size, "fuzz.npy");
  } catch (const c10::Error& e) {
    speedtorch::fuzzing::check_message(e, "fuzz_npy_header");
    return 0;  // rejected with a message that reaches Python: fine
  }
  check_consistent(data, size, h);
  return 0;
}

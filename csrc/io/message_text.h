// Text read from a file, made fit for an error message: printable ASCII is kept, every other byte is shown as \xNN.
// Quoted as they are, a damaged file's bytes need not be valid UTF-8, and Python, which decodes a c10::Error's
// message as UTF-8, would then raise UnicodeDecodeError in place of the error that explains the damage (found by
// tests/python/test_reliability.py's bit flips and the fuzz targets of tests/fuzz/).
#pragma once

#include <cstdio>
#include <string>

namespace speedtorch::io {

inline std::string printable(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) {
      out.push_back(c);
    } else {
      char esc[5];
      std::snprintf(esc, sizeof(esc), "\\x%02x", u);
      out += esc;
    }
  }
  return out;
}

}  // namespace speedtorch::io

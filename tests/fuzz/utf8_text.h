// Fuzz-target helper: the check that a c10::Error's message is valid UTF-8. Python turns the message into a str by
// decoding it as UTF-8, so a message quoting a damaged file's raw bytes would surface as a UnicodeDecodeError in
// place of the error that explains the damage.
#pragma once

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace speedtorch::fuzzing {

// As Python's strict decoder: no overlong forms, no surrogates, nothing above U+10FFFF.
inline bool valid_utf8(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t extra = 0;
    unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
    if (c < 0x80) {
      extra = 0;
    } else if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;  // cut short
    for (std::size_t k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (b < low || b > high) : (b >> 6) != 0x2) return false;
    }
    i += extra + 1;
  }
  return true;
}

// Aborts (a fuzzer finding) when the error's message would not reach Python as a RuntimeError (Python shows the
// message without the C++ backtrace unless TORCH_SHOW_CPP_STACKTRACES is set; frames are ASCII anyway).
inline void check_message(const c10::Error& e, const char* target) {
  if (!valid_utf8(e.what_without_backtrace())) {
    std::fprintf(stderr, "%s: an error message is not valid UTF-8 (Python would raise UnicodeDecodeError):\n%s\n",
                 target, e.what_without_backtrace());
    std::abort();
  }
}

}  // namespace speedtorch::fuzzing

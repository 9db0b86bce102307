// The JSON of meta files (io/embedding_files.h), read and written with nlohmann-json (Debian: nlohmann-json3-dev).
// What this wrapper adds to the library is what the file format needs and the library does not do:
// - Python's literals NaN, Infinity and -Infinity (json.dump writes them; so do we, for an option set to inf), which
//   nlohmann-json neither reads nor writes (it writes null);
// - numbers read and written as the doubles they always were ("-0" is -0.0; the shortest form that reads back as
//   the same double, std::to_chars's, not nlohmann-json's), so files are byte for byte what earlier versions wrote
//   and their "meta_hash" (over the doubles' bits) still matches;
// - strings that are not UTF-8, which earlier versions wrote for such file names, read as the bytes they are;
// - what a meta file may not hold: arrays, objects nested more than 8 deep, a key twice, a NUL byte;
// - every error as a c10::Error naming the file, its message printable ASCII (io/message_text.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace speedtorch::io {

// A JSON value whose objects keep their members in file order (the order "meta_hash" covers them in).
using MetaJson = nlohmann::ordered_json;

// Parses a meta file's text (strict JSON plus NaN / Infinity / -Infinity); `name` names the file in errors.
MetaJson parse_meta_json(const std::string& text, const std::string& name);

// The text of a meta file: two-space indentation, one member per line, a final newline; numbers as std::to_chars
// writes a double (the C locale's notation whatever the process's locale), NaN / Infinity / -Infinity for the
// others; strings escape '"', '\\' and control characters (\u00XX) only.
std::string to_meta_json(const MetaJson& value);

// `bytes` as valid UTF-8: an ill-formed sequence becomes U+FFFD (for file names, which on Linux are any bytes,
// before they go into a meta file that every JSON reader, this one included, must be able to read).
std::string valid_utf8(const std::string& bytes);

}  // namespace speedtorch::io

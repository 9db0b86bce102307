// Meta files' JSON on nlohmann-json (see meta_json.h).
#include "io/meta_json.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <set>
#include <vector>

#include "io/message_text.h"

namespace speedtorch::io {
namespace {

// nlohmann-json reads strict JSON only, so NaN, Infinity and -Infinity reach it as stand-ins: integers too large
// for a double to hold exactly, which the stand-in pass below makes sure never come from the file itself.
constexpr uint64_t kNaNStandIn = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kInfinityStandIn = kNaNStandIn - 1;
constexpr uint64_t kMinusInfinityStandIn = kNaNStandIn - 2;

// Earlier versions wrote a file name's bytes into the meta file as they were, UTF-8 or not, and read them back so
// ("meta_hash" covers them). nlohmann-json reads UTF-8 only, so a byte b that is not part of a well-formed UTF-8
// sequence reaches it as the escape of U+10FF00 + b (the last 128 code points of a private use plane) and is turned
// back into the byte after parsing, in files that needed it only.
constexpr uint32_t kByteStandInBase = 0x10FF00;

// The length of the well-formed UTF-8 sequence at s[i] (Unicode's table 3-7), or 0.
std::size_t utf8_length(const std::string& s, std::size_t i) {
  const auto at = [&s](std::size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const auto cont = [](unsigned c, unsigned lo = 0x80, unsigned hi = 0xBF) { return c >= lo && c <= hi; };
  const unsigned b = at(i);
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return cont(at(i + 1)) ? 2 : 0;
  if (b >= 0xE0 && b <= 0xEF) {
    const bool second = b == 0xE0 ? cont(at(i + 1), 0xA0) : b == 0xED ? cont(at(i + 1), 0x80, 0x9F) : cont(at(i + 1));
    return second && cont(at(i + 2)) ? 3 : 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    const bool second = b == 0xF0 ? cont(at(i + 1), 0x90) : b == 0xF4 ? cont(at(i + 1), 0x80, 0x8F) : cont(at(i + 1));
    return second && cont(at(i + 2)) && cont(at(i + 3)) ? 4 : 0;
  }
  return 0;
}

// `s` with the bytes' stand-ins (UTF-8 F4 8F BE/BF xx) turned back into the bytes.
std::string restore_bytes(const std::string& s) {
  const auto u = [&s](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i + 3 < s.size() && u(i) == 0xF4 && u(i + 1) == 0x8F && (u(i + 2) == 0xBE || u(i + 2) == 0xBF)) {
      out.push_back(static_cast<char>(((u(i + 2) & 0x03) << 6) | (u(i + 3) & 0x3F)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Every key and string in `v` with its bytes restored.
void restore_bytes(MetaJson& v) {
  if (v.is_object()) {
    MetaJson restored = MetaJson::object();
    for (auto& member : v.items()) {
      restore_bytes(member.value());
      restored[restore_bytes(member.key())] = std::move(member.value());
    }
    v = std::move(restored);
  } else if (v.is_string()) {
    v = restore_bytes(v.get_ref<const std::string&>());
  }
}

bool is_delimiter(char c) {
  switch (c) {
    case ' ': case '\t': case '\r': case '\n': case '{': case '}': case '[': case ']': case ':': case ',': case '"':
      return true;
    default:
      return false;
  }
}

// `text` with every bare word (outside strings) that strict JSON lacks replaced: NaN / Infinity / -Infinity by
// their stand-ins, "-0" by "-0.0" (nlohmann-json reads "-0" as the integer 0; it has always meant the double -0.0),
// and a stand-in's own digits by the same number as a double ("...615.0"), as any other reader takes them. Strings
// are copied as they are but for bytes that are not UTF-8 (kByteStandInBase); nlohmann-json checks everything else.
std::string with_stand_ins(const std::string& text, bool& bytes_stood_in) {
  const std::string stand_ins[] = {std::to_string(kNaNStandIn), std::to_string(kInfinityStandIn),
                                   std::to_string(kMinusInfinityStandIn)};
  std::string out;
  out.reserve(text.size() + 16);
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '"') {  // a string, escapes and all, up to its closing quote
      out.push_back(text[i++]);
      while (i < text.size() && text[i] != '"') {
        const std::size_t n = text[i] == '\\' ? std::min<std::size_t>(2, text.size() - i) : utf8_length(text, i);
        if (n > 0) {
          out.append(text, i, n);
          i += n;
        } else {  // a byte that is not UTF-8: its stand-in's escape (a surrogate pair)
          char escape[16];
          const uint32_t unit = kByteStandInBase + static_cast<unsigned char>(text[i++]) - 0x10000;
          std::snprintf(escape, sizeof(escape), "\\u%04x\\u%04x", 0xD800 + (unit >> 10), 0xDC00 + (unit & 0x3FF));
          out += escape;
          bytes_stood_in = true;
        }
      }
      if (i < text.size()) out.push_back(text[i++]);
    } else if (is_delimiter(text[i])) {
      out.push_back(text[i++]);
    } else {
      std::size_t j = i;
      while (j < text.size() && !is_delimiter(text[j])) ++j;
      const std::string word = text.substr(i, j - i);
      if (word == "NaN") {
        out += stand_ins[0];
      } else if (word == "Infinity") {
        out += stand_ins[1];
      } else if (word == "-Infinity") {
        out += stand_ins[2];
      } else if (word == "-0") {
        out += "-0.0";
      } else if (std::find(std::begin(stand_ins), std::end(stand_ins), word) != std::end(stand_ins)) {
        out += word + ".0";
      } else {
        out += word;
      }
      i = j;
    }
  }
  return out;
}

void quote(std::string& out, const std::string& s) {
  out.push_back('"');
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", static_cast<unsigned>(c));
      out += esc;
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

void write_number(std::string& out, double v) {
  if (std::isnan(v)) {
    out += "NaN";
  } else if (std::isinf(v)) {
    out += v > 0 ? "Infinity" : "-Infinity";
  } else {
    // The shortest form that reads back as the same double (0.1, not 0.10000000000000001), in the C locale's
    // notation whatever the process's locale.
    char num[32];
    const auto result = std::to_chars(num, num + sizeof(num), v);
    out.append(num, result.ptr);
  }
}

void write(std::string& out, const MetaJson& v, int indent) {
  switch (v.type()) {
    case MetaJson::value_t::null: out += "null"; return;
    case MetaJson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case MetaJson::value_t::string: quote(out, v.get_ref<const std::string&>()); return;
    case MetaJson::value_t::number_integer:
    case MetaJson::value_t::number_unsigned:
    case MetaJson::value_t::number_float: write_number(out, v.get<double>()); return;
    case MetaJson::value_t::object: {
      if (v.empty()) {
        out += "{}";
        return;
      }
      out += "{\n";
      std::size_t left = v.size();
      for (const auto& member : v.items()) {
        out.append(static_cast<std::size_t>(indent + 2), ' ');
        quote(out, member.key());
        out += ": ";
        write(out, member.value(), indent + 2);
        out += --left > 0 ? ",\n" : "\n";
      }
      out.append(static_cast<std::size_t>(indent), ' ');
      out += "}";
      return;
    }
    default:
      TORCH_CHECK(false, "speedtorch: a meta file holds objects, strings, numbers, booleans and null, not ",
                  v.type_name());
  }
}

}  // namespace

MetaJson parse_meta_json(const std::string& text, const std::string& name) {
  const auto fail = [&name](const std::string& what) {
    TORCH_CHECK(false, "speedtorch: ", name, " is not valid JSON: ", printable(what));
  };
  // nlohmann-json ends its input at a NUL byte: "{...}\0anything" would read as the object.
  const std::size_t nul = text.find('\0');
  if (nul != std::string::npos) fail("a NUL byte at offset " + std::to_string(nul));
  std::vector<std::set<std::string>> keys;  // those of each object still open
  const MetaJson::parser_callback_t check = [&](int depth, MetaJson::parse_event_t event, MetaJson& parsed) {
    switch (event) {
      case MetaJson::parse_event_t::object_start:
        if (depth >= 8) fail("objects nested too deeply");
        keys.emplace_back();
        break;
      case MetaJson::parse_event_t::object_end:
        keys.pop_back();
        break;
      case MetaJson::parse_event_t::array_start:
        fail("arrays are not expected in a meta file");
        break;
      case MetaJson::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(key).second) fail("the key \"" + key + "\" appears twice in one object");
        break;
      }
      case MetaJson::parse_event_t::value:
        if (parsed.is_number_unsigned()) {
          const uint64_t u = parsed.get<uint64_t>();
          if (u == kNaNStandIn) parsed = std::numeric_limits<double>::quiet_NaN();
          if (u == kInfinityStandIn) parsed = HUGE_VAL;
          if (u == kMinusInfinityStandIn) parsed = -HUGE_VAL;
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    bool bytes_stood_in = false;
    MetaJson parsed = MetaJson::parse(with_stand_ins(text, bytes_stood_in), check);
    if (bytes_stood_in) restore_bytes(parsed);
    return parsed;
  } catch (const MetaJson::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 9: ..." without the bracketed id.
    const std::string what = e.what();
    const std::size_t id_end = what.find("] ");
    fail(id_end == std::string::npos ? what : what.substr(id_end + 2));
  }
  return {};  // not reached
}

std::string to_meta_json(const MetaJson& value) {
  std::string out;
  write(out, value, 0);
  out.push_back('\n');
  return out;
}

std::string valid_utf8(const std::string& bytes) {
  // nlohmann-json's serializer writes each ill-formed sequence as U+FFFD when told to; reading that back gives the
  // string.
  return MetaJson::parse(MetaJson(bytes).dump(-1, ' ', false, MetaJson::error_handler_t::replace)).get<std::string>();
}

}  // namespace speedtorch::io

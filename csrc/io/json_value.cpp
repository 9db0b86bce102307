// JSON reading and writing for meta files (see json_value.h).
#include "io/json_value.h"

#include <c10/util/Exception.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace speedtorch::io {
namespace {

class Parser {
 public:
  Parser(const std::string& s, const std::string& name) : s_(s), name_(name) {}

  JsonValue document() {
    JsonValue v = value(0);
    space();
    if (i_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    TORCH_CHECK(false, "speedtorch: ", name_, " is not valid JSON: ", what, " (at offset ", i_, ")");
  }
  void space() {
    // (strchr would also find the terminating NUL: a NUL byte is not white space.)
    while (i_ < s_.size() && s_[i_] != '\0' && std::strchr(" \t\r\n", s_[i_]) != nullptr) ++i_;
  }
  bool digit(std::size_t at) const { return at < s_.size() && s_[at] >= '0' && s_[at] <= '9'; }
  // Where the JSON number starting at i_ ends: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?. from_chars alone
  // would also take "01", ".5" or "inf": a damaged digit must not read as another, valid, number.
  std::size_t number_end() {
    std::size_t j = i_;
    if (j < s_.size() && s_[j] == '-') ++j;
    if (!digit(j)) fail("expected a value");
    if (s_[j] == '0') {
      if (digit(++j)) fail("malformed number (a leading zero)");
    } else {
      while (digit(j)) ++j;
    }
    if (j < s_.size() && s_[j] == '.') {
      if (!digit(++j)) fail("malformed number");
      while (digit(j)) ++j;
    }
    if (j < s_.size() && (s_[j] == 'e' || s_[j] == 'E')) {
      ++j;
      if (j < s_.size() && (s_[j] == '+' || s_[j] == '-')) ++j;
      if (!digit(j)) fail("malformed number");
      while (digit(j)) ++j;
    }
    return j;
  }
  bool word(const char* w) {
    const std::size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }

  JsonValue value(int depth) {
    if (depth > 8) fail("objects nested too deeply");
    space();
    if (i_ >= s_.size()) fail("unexpected end");
    const char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '"') return JsonValue::of(string());
    const bool is_true = word("true");
    if (is_true || word("false")) {
      JsonValue v;
      v.kind = JsonValue::Kind::kBool;
      v.boolean = is_true;
      return v;
    }
    if (word("null")) return JsonValue{};
    if (word("NaN")) return JsonValue::of(std::nan(""));
    if (word("Infinity")) return JsonValue::of(HUGE_VAL);
    if (word("-Infinity")) return JsonValue::of(-HUGE_VAL);
    if (c == '[') fail("arrays are not expected in a meta file");
    // from_chars, not strtod: numbers read the same whatever the process's locale (no "0,001").
    const char* begin = s_.c_str() + i_;
    const char* grammar_end = s_.c_str() + number_end();
    double v = 0;
    const auto [end, error] = std::from_chars(begin, s_.c_str() + s_.size(), v);
    if (error != std::errc() || end == begin || end != grammar_end) fail("expected a value");
    i_ += static_cast<std::size_t>(end - begin);
    return JsonValue::of(v);
  }

  JsonValue object(int depth) {
    JsonValue obj = JsonValue::object();
    ++i_;  // '{'
    space();
    if (i_ < s_.size() && s_[i_] == '}') return ++i_, obj;
    while (true) {
      space();
      if (i_ >= s_.size() || s_[i_] != '"') fail("expected a quoted key");
      std::string key = string();
      space();
      if (i_ >= s_.size() || s_[i_] != ':') fail("expected ':'");
      ++i_;
      obj.set(key, value(depth + 1));
      space();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, obj;
      fail("expected ',' or '}'");
    }
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        if (i_ >= s_.size()) break;
        const char e = s_[i_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case 'b': c = '\b'; break;
          case 'f': c = '\f'; break;
          case 'u': {
            if (i_ + 4 > s_.size()) fail("bad \\u escape");
            const unsigned code = static_cast<unsigned>(std::strtoul(s_.substr(i_, 4).c_str(), nullptr, 16));
            i_ += 4;
            if (code < 0x80) {
              c = static_cast<char>(code);
            } else if (code < 0x800) {
              out.push_back(static_cast<char>(0xC0 | (code >> 6)));
              c = static_cast<char>(0x80 | (code & 0x3F));
            } else {
              out.push_back(static_cast<char>(0xE0 | (code >> 12)));
              out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
              c = static_cast<char>(0x80 | (code & 0x3F));
            }
            break;
          }
          default: c = e;  // \" \\ \/
        }
      }
      out.push_back(c);
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;  // closing quote
    return out;
  }

  const std::string& s_;
  const std::string& name_;
  std::size_t i_ = 0;
};

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

void write(std::string& out, const JsonValue& v, int indent) {
  switch (v.kind) {
    case JsonValue::Kind::kNull: out += "null"; return;
    case JsonValue::Kind::kBool: out += v.boolean ? "true" : "false"; return;
    case JsonValue::Kind::kString: quote(out, v.text); return;
    case JsonValue::Kind::kNumber: {
      if (std::isnan(v.number)) {
        out += "NaN";
      } else if (std::isinf(v.number)) {
        out += v.number > 0 ? "Infinity" : "-Infinity";
      } else {
        // The shortest form that reads back as the same double (0.1, not 0.10000000000000001), in the C locale's
        // notation whatever the process's locale.
        char num[32];
        const auto result = std::to_chars(num, num + sizeof(num), v.number);
        out.append(num, result.ptr);
      }
      return;
    }
    case JsonValue::Kind::kObject: {
      if (v.members.empty()) {
        out += "{}";
        return;
      }
      out += "{\n";
      for (std::size_t m = 0; m < v.members.size(); ++m) {
        out.append(static_cast<std::size_t>(indent + 2), ' ');
        quote(out, v.members[m].first);
        out += ": ";
        write(out, v.members[m].second, indent + 2);
        out += m + 1 < v.members.size() ? ",\n" : "\n";
      }
      out.append(static_cast<std::size_t>(indent), ' ');
      out += "}";
      return;
    }
  }
}

}  // namespace

JsonValue JsonValue::of(double v) {
  JsonValue out;
  out.kind = Kind::kNumber;
  out.number = v;
  return out;
}

JsonValue JsonValue::of(std::string v) {
  JsonValue out;
  out.kind = Kind::kString;
  out.text = std::move(v);
  return out;
}

JsonValue JsonValue::object() {
  JsonValue out;
  out.kind = Kind::kObject;
  return out;
}

JsonValue& JsonValue::set(const std::string& key, JsonValue value) {
  members.emplace_back(key, std::move(value));
  return *this;
}

const JsonValue* JsonValue::find(const std::string& key) const {
  for (const auto& m : members) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

JsonValue parse_json(const std::string& text, const std::string& name) { return Parser(text, name).document(); }

std::string to_json(const JsonValue& value) {
  std::string out;
  write(out, value, 0);
  out.push_back('\n');
  return out;
}

}  // namespace speedtorch::io

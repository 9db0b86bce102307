// The incremental HTTP/1.1 request parser (see http_request_parser.h). Grammar from RFC 9112.
#include "http_request_parser.h"

#include <algorithm>
#include <cctype>
#include <optional>

namespace speedtorch::serving {
namespace {

constexpr std::size_t kMaxChunkLine = 1024;  // a chunk-size line with its extensions

// tchar of RFC 9110: the characters of methods and header names.
bool is_token_char(char c) {
  if (std::isalnum(static_cast<unsigned char>(c))) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_token(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), is_token_char); }

// Field values: visible characters, spaces, tabs and bytes >= 0x80 (obs-text); no other control characters.
bool is_field_value(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 ? u != 0x7F : u == '\t';
  });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Whether the comma-separated list `value` holds `token` (case-insensitive), as in "Connection: keep-alive, close".
bool list_has(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    const std::size_t comma = value.find(',');
    if (lower(trim(value.substr(0, comma))) == token) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

// Where the head in `text` ends (just past its blank line), searching from `from`; npos when it has not arrived.
// Lines end in CRLF, or in a bare LF: RFC 9112 2.2 lets a recipient take a lone LF as a line's end (curl, ab and
// nc send CRLF; a hand-typed request may not).
std::size_t head_end(const std::string& text, std::size_t from) {
  for (std::size_t lf = text.find('\n', from); lf != std::string::npos; lf = text.find('\n', lf + 1)) {
    if (lf + 1 < text.size() && text[lf + 1] == '\n') return lf + 2;
    if (lf + 2 < text.size() && text[lf + 1] == '\r' && text[lf + 2] == '\n') return lf + 3;
  }
  return std::string::npos;
}

}  // namespace

const std::string* HttpRequest::header(std::string_view lower_case_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_case_name) return &value;
  }
  return nullptr;
}

void HttpRequestParser::reset() {
  state_ = State::kHead;
  head_.clear();
  request_ = HttpRequest();
  body_mode_ = BodyMode::kNone;
  body_length_ = 0;
  chunk_state_ = ChunkState::kSize;
  chunk_line_.clear();
  chunk_left_ = 0;
  trailer_bytes_ = 0;
  error_status_ = 0;
  error_message_.clear();
}

void HttpRequestParser::fail(int status, std::string message) {
  state_ = State::kFailed;
  error_status_ = status;
  error_message_ = std::move(message);
}

std::size_t HttpRequestParser::feed(std::string_view data) {
  std::size_t used = 0;
  if (state_ == State::kHead) used += feed_head(data);
  if (state_ == State::kBody) used += feed_body(data.substr(used));
  return used;
}

std::size_t HttpRequestParser::feed_head(std::string_view data) {
  std::size_t used = 0;
  // Empty lines before a request line are ignored (RFC 9112 2.2: some clients send CRLF after a body).
  while (head_.empty() && used < data.size() && (data[used] == '\r' || data[used] == '\n')) ++used;
  if (used == data.size()) return used;
  const std::size_t before = head_.size();
  const std::size_t room = limits_.max_head_bytes + 1 - std::min(before, limits_.max_head_bytes + 1);
  const std::size_t take = std::min(data.size() - used, room);
  head_.append(data.substr(used, take));
  // The blank line may straddle what we had and what came: search from 2 bytes back.
  const std::size_t end = head_end(head_, before >= 2 ? before - 2 : 0);
  if (end == std::string::npos) {
    if (head_.size() > limits_.max_head_bytes) {
      fail(431, "the request line and headers exceed " + std::to_string(limits_.max_head_bytes) + " bytes");
    }
    return used + take;
  }
  // Bytes after the blank line are not the head's: give them back.
  const std::size_t returned = head_.size() - end;
  head_.resize(end);
  used += take - returned;
  if (!parse_head()) return used;
  state_ = body_mode_ == BodyMode::kNone ? State::kComplete : State::kBody;
  return used;
}

bool HttpRequestParser::parse_head() {
  std::string_view rest(head_);
  rest.remove_suffix(rest.size() >= 2 && rest[rest.size() - 2] == '\r' ? 2 : 1);  // the blank line
  const auto next_line = [&rest]() {  // every line left ends in LF, most in CRLF
    const std::size_t eol = rest.find('\n');
    std::string_view line = rest.substr(0, eol);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    rest.remove_prefix(eol + 1);
    return line;
  };
  // request-line = method SP request-target SP HTTP-version
  const std::string_view line = next_line();
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    fail(400, "malformed request line");
    return false;
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method)) {
    fail(400, "malformed method");
    return false;
  }
  if (target.empty() || target[0] != '/' ||
      !std::all_of(target.begin(), target.end(), [](char c) { return c > 0x20 && c < 0x7F; })) {
    fail(400, "the request target must be a path (origin form)");
    return false;
  }
  if (version == "HTTP/1.1" || version == "HTTP/1.0") {
    request_.minor_version = version.back() - '0';
  } else if (version.size() == 8 && version.substr(0, 5) == "HTTP/" && is_digit(version[5]) &&
             version[6] == '.' && is_digit(version[7])) {
    fail(505, "only HTTP/1.0 and HTTP/1.1 are served");
    return false;
  } else {
    fail(400, "malformed HTTP version");
    return false;
  }
  request_.method = std::string(method);
  request_.target = std::string(target);
  request_.path = request_.target.substr(0, request_.target.find('?'));

  std::optional<std::string> content_length;  // a copy: headers may reallocate as more are added
  bool chunked = false;
  while (!rest.empty()) {
    const std::string_view field = next_line();
    const std::size_t colon = field.find(':');
    // No whitespace before the colon, no line folding (RFC 9112 5.1, 5.2).
    if (colon == std::string_view::npos || !is_token(field.substr(0, colon))) {
      fail(400, "malformed header line");
      return false;
    }
    const std::string_view value = trim(field.substr(colon + 1));
    if (!is_field_value(value)) {
      fail(400, "a header value holds control characters");
      return false;
    }
    if (request_.headers.size() == limits_.max_headers) {
      fail(431, "more than " + std::to_string(limits_.max_headers) + " headers");
      return false;
    }
    request_.headers.emplace_back(lower(field.substr(0, colon)), std::string(value));
    const std::string& name = request_.headers.back().first;
    const std::string& text = request_.headers.back().second;
    if (name == "content-length") {
      const bool digits = !text.empty() && text.size() <= 18 &&
                          std::all_of(text.begin(), text.end(), is_digit);
      if (!digits || (content_length && *content_length != text)) {
        fail(400, "malformed or conflicting Content-Length");
        return false;
      }
      content_length = text;
    } else if (name == "transfer-encoding") {
      if (lower(text) != "chunked" || chunked) {
        fail(501, "the only transfer coding served is a single 'chunked'");
        return false;
      }
      chunked = true;
    } else if (name == "connection") {
      if (list_has(text, "close")) request_.keep_alive = false;
      else if (list_has(text, "keep-alive")) request_.keep_alive = true;
    } else if (name == "expect") {
      if (lower(text) != "100-continue") {
        fail(417, "the only expectation served is 100-continue");
        return false;
      }
      request_.expects_continue = true;
    }
  }
  if (request_.minor_version == 0 && !(request_.header("connection") &&
                                       list_has(*request_.header("connection"), "keep-alive"))) {
    request_.keep_alive = false;
  }
  if (chunked && content_length) {
    fail(400, "a request cannot have both Content-Length and Transfer-Encoding");
    return false;
  }
  if (chunked) {
    body_mode_ = BodyMode::kChunked;
  } else if (content_length) {
    body_length_ = std::stoull(*content_length);
    if (body_length_ > limits_.max_body_bytes) {
      fail(413, "the body of " + *content_length + " bytes exceeds the limit of " +
                    std::to_string(limits_.max_body_bytes) + " bytes");
      return false;
    }
    if (body_length_ > 0) {
      body_mode_ = BodyMode::kLength;
      request_.body.reserve(body_length_);
    }
  }
  if (body_mode_ == BodyMode::kNone && request_.method == "POST" && !content_length) {
    fail(411, "a POST needs a Content-Length header (or Transfer-Encoding: chunked)");
    return false;
  }
  if (body_mode_ == BodyMode::kNone) request_.expects_continue = false;  // nothing to wait for
  return true;
}

std::size_t HttpRequestParser::feed_body(std::string_view data) {
  if (body_mode_ == BodyMode::kChunked) return feed_chunked(data);
  const std::size_t take = std::min(data.size(), body_length_ - request_.body.size());
  request_.body.append(data.substr(0, take));
  if (request_.body.size() == body_length_) state_ = State::kComplete;
  return take;
}

std::size_t HttpRequestParser::feed_chunked(std::string_view data) {
  std::size_t used = 0;
  while (used < data.size() && state_ == State::kBody) {
    if (chunk_state_ == ChunkState::kData) {
      const std::size_t take = std::min(data.size() - used, chunk_left_);
      request_.body.append(data.substr(used, take));
      used += take;
      chunk_left_ -= take;
      if (chunk_left_ == 0) chunk_state_ = ChunkState::kDataEnd;
      continue;
    }
    // The other states read a line (or the CRLF after a chunk's data) byte by byte into chunk_line_.
    const char c = data[used++];
    chunk_line_ += c;
    if (chunk_state_ == ChunkState::kTrailer && ++trailer_bytes_ + head_.size() > limits_.max_head_bytes) {
      fail(431, "the chunked body's trailers exceed the header limit");
      break;
    }
    if (chunk_line_.size() > kMaxChunkLine) {
      fail(400, "malformed chunk size line");
      break;
    }
    if (c != '\n') continue;
    const std::size_t n = chunk_line_.size();
    if (n < 2 || chunk_line_[n - 2] != '\r') {
      fail(400, "chunked body lines must end in CRLF");
      break;
    }
    const std::string_view line(chunk_line_.data(), n - 2);
    if (chunk_state_ == ChunkState::kDataEnd) {
      if (!line.empty()) {
        fail(400, "a chunk's data is longer than its size");
        break;
      }
      chunk_state_ = ChunkState::kSize;
    } else if (chunk_state_ == ChunkState::kSize) {
      // chunk-size [; extensions]: hexadecimal, at most 15 digits (no overflow); extensions are ignored.
      const std::string_view size_text = trim(line.substr(0, line.find(';')));
      if (size_text.empty() || size_text.size() > 15 ||
          !std::all_of(size_text.begin(), size_text.end(),
                       [](char h) { return std::isxdigit(static_cast<unsigned char>(h)); }) ||
          !is_field_value(line)) {
        fail(400, "malformed chunk size");
        break;
      }
      const std::size_t size = std::stoull(std::string(size_text), nullptr, 16);
      if (size > limits_.max_body_bytes - request_.body.size()) {
        fail(413, "the chunked body exceeds the limit of " + std::to_string(limits_.max_body_bytes) + " bytes");
        break;
      }
      chunk_left_ = size;
      chunk_state_ = size == 0 ? ChunkState::kTrailer : ChunkState::kData;
    } else if (line.empty()) {  // kTrailer: the blank line ends the request
      state_ = State::kComplete;
    }
    chunk_line_.clear();
  }
  return used;
}

const char* http_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

}  // namespace speedtorch::serving

// HttpRequestParser: reads HTTP/1.1 requests from a connection's bytes, one request at a time, incrementally (bytes
// may arrive one at a time), with limits on everything a client controls: the request line and headers together
// (max_head_bytes, chunk trailers included), the number of headers, and the body, whether its length is announced
// (Content-Length) or not (Transfer-Encoding: chunked; the limit applies to the decoded bytes as they arrive, so
// a chunked body never grows past it). Nothing is recursive; memory is the head plus at most max_body_bytes.
//
// Lines of the head end in CRLF or a bare LF (RFC 9112 2.2); a chunked body's lines need CRLF.
// What it refuses, with the status to answer: a malformed request line or header (400), a version other than
// HTTP/1.0 or 1.1 (505), a head over its limit (431), a body over its limit (413), Content-Length together with
// Transfer-Encoding or two different lengths (400: the ways requests are smuggled past proxies), a transfer coding
// other than chunked (501), a POST with neither a length nor chunked (411). After a refusal the connection must be closed: its remaining bytes cannot be framed.
//
// Free of sockets so that GoogleTest and the fuzz target (tests/fuzz/fuzz_request_body.cpp) drive it directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace speedtorch::serving {

struct HttpLimits {
  std::size_t max_head_bytes = 16 << 10;
  std::size_t max_headers = 100;
  std::size_t max_body_bytes = 64 << 20;
};

struct HttpRequest {
  std::string method;
  std::string target;  // as sent: path and query
  std::string path;    // target up to '?'
  int minor_version = 1;
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case, values trimmed
  std::string body;
  bool keep_alive = true;        // HTTP/1.1 unless "Connection: close"; HTTP/1.0 only with "Connection: keep-alive"
  bool expects_continue = false;  // "Expect: 100-continue": the client waits for a 100 before sending its body

  // The value of the first header named `lower_case_name`, or nullptr.
  const std::string* header(std::string_view lower_case_name) const;
};

class HttpRequestParser {
 public:
  enum class State {
    kHead,      // reading the request line and headers
    kBody,      // headers read (request() has them), body still arriving
    kComplete,  // request() is whole; reset() before the next
    kFailed,    // error_status() / error_message() say why; the connection must close
  };

  explicit HttpRequestParser(HttpLimits limits = {}) : limits_(limits) {}

  // Consumes bytes of `data` for the current request and returns how many it took; it stops at the end of the
  // request (the rest belongs to the next one) and on a failure.
  std::size_t feed(std::string_view data);

  State state() const { return state_; }
  bool started() const { return state_ != State::kHead || !head_.empty(); }  // any byte of a request seen
  HttpRequest& request() { return request_; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

  // Ready for the next request on the same connection.
  void reset();

 private:
  enum class BodyMode { kNone, kLength, kChunked };
  enum class ChunkState { kSize, kData, kDataEnd, kTrailer };

  std::size_t feed_head(std::string_view data);
  std::size_t feed_body(std::string_view data);
  std::size_t feed_chunked(std::string_view data);
  bool parse_head();  // head_ holds request line + headers up to the blank line
  void fail(int status, std::string message);

  HttpLimits limits_;
  State state_ = State::kHead;
  std::string head_;  // bytes of the head so far
  HttpRequest request_;
  BodyMode body_mode_ = BodyMode::kNone;
  std::size_t body_length_ = 0;  // kLength: bytes announced
  ChunkState chunk_state_ = ChunkState::kSize;
  std::string chunk_line_;        // a chunk-size line or trailer line so far
  std::size_t chunk_left_ = 0;    // bytes of the current chunk still to come
  std::size_t trailer_bytes_ = 0;  // counted against max_head_bytes with the head
  int error_status_ = 0;
  std::string error_message_;
};

// The reason phrase for a status code this server sends.
const char* http_reason(int status);

}  // namespace speedtorch::serving

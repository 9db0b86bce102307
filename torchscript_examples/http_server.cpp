// The epoll HTTP/1.1 server (see http_server.h).
#include "http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace speedtorch::serving {
namespace {

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr std::size_t kReadChunk = 64 << 10;
// After refusing a request the server stops writing but reads (and drops) what the client still sends, for at most
// this long: closing a socket with unread bytes sends a reset, which can destroy the refusal before it is read.
constexpr double kLingerSeconds = 1.0;

std::runtime_error system_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

struct HttpServer::Connection {
  enum class Phase {
    kReading,     // waiting for (the rest of) a request
    kProcessing,  // a whole request is with the handler; nothing is read meanwhile
    kWriting,     // an answer is partly written; waiting for the socket to take more
    kLingering,   // refused: reading and dropping until the client closes or kLingerSeconds pass
  };
  int fd = -1;
  uint64_t id = 0;
  HttpRequestParser parser;
  std::string in;  // bytes read and not yet parsed (the start of a pipelined request)
  Phase phase = Phase::kReading;
  enum class Wait { kIdle, kHead, kBody } wait = Wait::kIdle;  // what the deadline is for, while kReading
  Clock::time_point deadline;
  Clock::time_point whole_at;  // when the request in processing was whole
  std::string method, path;    // of the request in processing, for the observer
  std::string out_head, out_body;
  std::size_t out_done = 0;  // bytes of out_head + out_body written
  bool close_after = false;
  bool http10 = false;     // the request was HTTP/1.0: keeping its connection open must be said (keep-alive)
  bool head_only = false;  // the request was HEAD: answered as GET, without the body
  bool peer_closed = false;  // the client shut down its side: answer, then close
  uint32_t events = 0;       // what epoll watches
};

Responder::~Responder() {
  if (server_ != nullptr) {
    respond({500, "application/json", {}, R"({"error": "the server dropped this request without an answer"})"});
  }
}

void Responder::respond(HttpResponse response) {
  if (server_ == nullptr) return;  // answered already
  std::exchange(server_, nullptr)->post(id_, std::move(response));
}

HttpServer::HttpServer(HttpServerOptions options, Handler handler, Observer observer)
    : options_(std::move(options)), handler_(std::move(handler)), observer_(std::move(observer)) {
  if (options_.max_connections < 1 || options_.backlog < 1) {
    throw std::runtime_error("max_connections and backlog must be >= 1");
  }
  // Every connection is a descriptor: raise the soft limit as far as needed (an accept that fails for want of one
  // would leave the listener readable, and the loop spinning).
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  const rlim_t needed = static_cast<rlim_t>(options_.max_connections) + 256;  // torch, CUDA and the rest
  if (files.rlim_cur < needed && files.rlim_max >= needed) {
    files.rlim_cur = needed;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  if (files.rlim_cur < needed) {
    throw std::runtime_error(std::to_string(options_.max_connections) + " connections need " +
                             std::to_string(needed) + " file descriptors, but the limit is " +
                             std::to_string(files.rlim_cur) + " (ulimit -n; or fewer --max-connections)");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(options_.port);
  if (const int rc = getaddrinfo(options_.host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    throw std::runtime_error("cannot resolve " + options_.host + ": " + gai_strerror(rc));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, options_.backlog) == 0) {
      listen_fd_ = fd;
    } else {
      why = std::strerror(errno);
      ::close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) throw std::runtime_error("cannot listen on " + options_.host + " port " + port_text + ": " + why);
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) throw system_error("epoll / eventfd");
  epoll_event listener{EPOLLIN, {.u64 = kListenerId}};
  epoll_event waker{EPOLLIN, {.u64 = kWakeId}};
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &listener) != 0 ||
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &waker) != 0) {
    throw system_error("epoll_ctl");
  }
}

HttpServer::~HttpServer() {
  for (auto& [id, c] : connections_) ::close(c->fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void HttpServer::wake() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);  // EAGAIN: already awake
}

void HttpServer::stop() {
  stop_requested_.store(true);
  wake();
}

void HttpServer::post(uint64_t id, HttpResponse response) {
  {
    std::lock_guard<std::mutex> lock(answers_mutex_);
    answers_.emplace_back(id, std::move(response));
    --unanswered_;  // under the lock: run() sees the answer queued before it sees the count reach 0
  }
  wake();
}

void HttpServer::watch(Connection& c, uint32_t events) {
  if (c.events == events) return;
  epoll_event e{events, {.u64 = c.id}};
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &e);
  c.events = events;
}

void HttpServer::close(uint64_t id) {
  const auto it = connections_.find(id);
  if (it == connections_.end()) return;
  ::close(it->second->fd);  // also removes it from the epoll set
  connections_.erase(it);
}

void HttpServer::accept_all() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN: none left; EMFILE and the like: the backlog holds them until a descriptor frees
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      // Make room by closing the connection idle the longest; with none idle, refuse the newcomer.
      Connection* oldest = nullptr;
      for (auto& [id, c] : connections_) {
        if (c->phase == Connection::Phase::kReading && c->wait == Connection::Wait::kIdle && c->in.empty() &&
            (oldest == nullptr || c->deadline < oldest->deadline)) {
          oldest = c.get();
        }
      }
      if (oldest == nullptr) {
        static const char kBusy[] =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 40\r\n"
            "Connection: close\r\n\r\n{\"error\": \"too many connections: retry\"}";
        [[maybe_unused]] const ssize_t n = ::send(fd, kBusy, sizeof kBusy - 1, MSG_NOSIGNAL);
        ::close(fd);
        if (observer_) observer_("", "", 503, -1);
        continue;
      }
      close(oldest->id);
    }
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->id = next_id_++;
    c->parser = HttpRequestParser(options_.limits);
    c->deadline = Clock::now() + seconds(options_.idle_timeout_s);
    c->events = EPOLLIN;
    epoll_event e{EPOLLIN, {.u64 = c->id}};
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &e) != 0) {
      ::close(fd);
      continue;
    }
    Connection& added = *c;
    connections_.emplace(added.id, std::move(c));
    if (stopping_) on_readable(added);  // taken from the backlog while stopping: answer what it sent already
  }
}

void HttpServer::on_readable(Connection& c) {
  const uint64_t id = c.id;
  char buffer[kReadChunk];
  while (true) {
    const ssize_t n = ::recv(c.fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      if (c.phase == Connection::Phase::kLingering) continue;  // dropped
      c.in.append(buffer, static_cast<std::size_t>(n));
      advance(c);
      if (connections_.count(id) == 0) return;
      if (c.phase != Connection::Phase::kReading) break;  // the rest waits until the answer is written
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // While stopping, a connection with no whole request left has nothing more to be answered.
      if (stopping_ && c.phase == Connection::Phase::kReading) close(id);
      return;
    }
    // End of stream or an error: a whole request already dispatched is still answered (the client may have shut
    // down only its sending side); anything partial is dropped.
    c.peer_closed = true;
    if (c.phase == Connection::Phase::kReading || c.phase == Connection::Phase::kLingering) close(id);
    return;
  }
}

void HttpServer::advance(Connection& c) {
  while (c.phase == Connection::Phase::kReading) {
    const std::size_t used = c.parser.feed(c.in);
    c.in.erase(0, used);
    switch (c.parser.state()) {
      case HttpRequestParser::State::kFailed:
        refuse(c, c.parser.error_status(), c.parser.error_message());
        return;
      case HttpRequestParser::State::kHead:
        if (c.parser.started() && c.wait == Connection::Wait::kIdle) {
          c.wait = Connection::Wait::kHead;
          c.deadline = Clock::now() + seconds(options_.header_timeout_s);
        }
        return;
      case HttpRequestParser::State::kBody:
        if (c.wait != Connection::Wait::kBody) {
          c.wait = Connection::Wait::kBody;
          c.deadline = Clock::now() + seconds(options_.body_timeout_s);
          if (c.parser.request().expects_continue) {
            static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
            [[maybe_unused]] const ssize_t n = ::send(c.fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL);
          }
        }
        return;
      case HttpRequestParser::State::kComplete: {
        HttpRequest request = std::move(c.parser.request());
        c.parser.reset();
        c.phase = Connection::Phase::kProcessing;
        c.wait = Connection::Wait::kIdle;
        c.whole_at = Clock::now();
        c.method = request.method;
        c.path = request.path;
        c.close_after = !request.keep_alive;
        c.http10 = request.minor_version == 0;
        c.head_only = request.method == "HEAD";
        if (c.head_only) request.method = "GET";  // the same answer, less its body (RFC 9110 9.3.2)
        watch(c, 0);  // read nothing more until this is answered
        ++unanswered_;
        handler_(std::move(request), Responder(this, c.id));
        return;
      }
    }
  }
}

void HttpServer::refuse(Connection& c, int status, const std::string& message) {
  HttpResponse response;
  response.status = status;
  response.body = "{\"error\": \"" + message + "\"}";  // our own messages: no quotes or backslashes in them
  c.method = c.parser.request().method;
  c.path = c.parser.request().path;
  c.close_after = true;
  c.head_only = c.method == "HEAD";
  send_answer(c, std::move(response), /*refused=*/true);
}

void HttpServer::send_answer(Connection& c, HttpResponse response, bool refused) {
  if (stopping_) c.close_after = true;
  std::string& head = c.out_head;
  head = "HTTP/1.1 " + std::to_string(response.status) + " " + http_reason(response.status) + "\r\nContent-Type: " +
         response.content_type + "\r\nContent-Length: " + std::to_string(response.body.size()) + "\r\n";
  for (const auto& [name, value] : response.headers) head += name + ": " + value + "\r\n";
  head += c.close_after ? "Connection: close\r\n\r\n" : c.http10 ? "Connection: keep-alive\r\n\r\n" : "\r\n";
  c.out_body = c.head_only ? std::string() : std::move(response.body);
  c.out_done = 0;
  if (observer_) {
    const double elapsed =
        refused ? -1 : std::chrono::duration<double>(Clock::now() - c.whole_at).count();
    observer_(c.method, c.path, response.status, elapsed);
  }
  c.phase = Connection::Phase::kWriting;
  c.deadline = Clock::now() + seconds(options_.write_timeout_s);
  flush(c);
}

void HttpServer::flush(Connection& c) {
  while (true) {
    const std::size_t head_left = c.out_done < c.out_head.size() ? c.out_head.size() - c.out_done : 0;
    const std::size_t body_done = c.out_done - (c.out_head.size() - head_left);
    iovec parts[2] = {{c.out_head.data() + (c.out_head.size() - head_left), head_left},
                      {c.out_body.data() + body_done, c.out_body.size() - body_done}};
    if (parts[0].iov_len + parts[1].iov_len == 0) break;
    msghdr message{};
    message.msg_iov = head_left > 0 ? parts : parts + 1;
    message.msg_iovlen = head_left > 0 ? 2 : 1;
    const ssize_t n = ::sendmsg(c.fd, &message, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      watch(c, EPOLLOUT);
      return;
    }
    if (n < 0) {  // the client is gone
      close(c.id);
      return;
    }
    c.out_done += static_cast<std::size_t>(n);
  }
  after_answer(c);
}

void HttpServer::after_answer(Connection& c) {
  c.out_head.clear();
  c.out_body.clear();
  c.out_body.shrink_to_fit();
  if (c.close_after || c.peer_closed) {
    // Stop sending, keep reading (and dropping) briefly, so that unread bytes do not turn the close into a reset
    // that destroys the answer before the client reads it.
    ::shutdown(c.fd, SHUT_WR);
    c.phase = Connection::Phase::kLingering;
    c.deadline = Clock::now() + seconds(kLingerSeconds);
    watch(c, EPOLLIN);
    if (c.peer_closed) close(c.id);
    return;
  }
  c.phase = Connection::Phase::kReading;
  c.wait = Connection::Wait::kIdle;
  c.deadline = Clock::now() + seconds(options_.idle_timeout_s);
  watch(c, EPOLLIN);
  const uint64_t id = c.id;
  advance(c);  // a pipelined request may be here already
  if (stopping_ && connections_.count(id) && c.phase == Connection::Phase::kReading) on_readable(c);
}

void HttpServer::begin_stop() {
  stopping_ = true;
  accept_all();  // connections the kernel has accepted for us are ours to answer
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  ::close(listen_fd_);
  listen_fd_ = -1;
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : connections_) ids.push_back(id);
  for (const uint64_t id : ids) {
    const auto it = connections_.find(id);
    if (it != connections_.end() && it->second->phase == Connection::Phase::kReading) on_readable(*it->second);
  }
}

void HttpServer::check_deadlines(Clock::time_point now) {
  std::vector<uint64_t> late;
  for (const auto& [id, c] : connections_) {
    if (c->phase != Connection::Phase::kProcessing && now >= c->deadline) late.push_back(id);
  }
  for (const uint64_t id : late) {
    Connection& c = *connections_.at(id);
    if (c.phase == Connection::Phase::kReading && c.wait != Connection::Wait::kIdle) {
      refuse(c, 408, c.wait == Connection::Wait::kHead ? "the request head did not arrive in time"
                                                       : "the request body did not arrive in time");
    } else {
      close(id);  // idle, a client that does not read its answer, or the end of a linger
    }
  }
}

void HttpServer::run() {
  epoll_event events[256];
  auto last_check = Clock::now();
  // A request whose client went away is not waited for, but its Responder must still find the server.
  while (!(stopping_ && connections_.empty() && unanswered_.load() == 0)) {
    const int n = epoll_wait(epoll_fd_, events, 256, 100);
    if (n < 0 && errno != EINTR) throw system_error("epoll_wait");
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kListenerId) {
        if (!stopping_) accept_all();
      } else if (id == kWakeId) {
        uint64_t count;
        [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &count, sizeof count);
        std::vector<std::pair<uint64_t, HttpResponse>> answers;
        {
          std::lock_guard<std::mutex> lock(answers_mutex_);
          answers.swap(answers_);
        }
        for (auto& [answer_id, response] : answers) {
          const auto it = connections_.find(answer_id);
          if (it != connections_.end() && it->second->phase == Connection::Phase::kProcessing) {
            send_answer(*it->second, std::move(response), /*refused=*/false);
          }
        }
        if (stop_requested_.load() && !stopping_) begin_stop();
      } else {
        const auto it = connections_.find(id);
        if (it == connections_.end()) continue;
        Connection& c = *it->second;
        if (c.phase == Connection::Phase::kWriting) {
          if (events[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) flush(c);
        } else if (c.phase != Connection::Phase::kProcessing) {
          on_readable(c);
        } else if (events[i].events & (EPOLLERR | EPOLLHUP)) {
          close(id);  // gone while its request is with the handler (reported even when nothing is watched)
        }
      }
    }
    const auto now = Clock::now();
    if (now - last_check >= std::chrono::milliseconds(50)) {
      check_deadlines(now);
      last_check = now;
    }
  }
}

}  // namespace speedtorch::serving

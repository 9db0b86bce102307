// MEASUREMENT PROTOTYPE (issue 34 item 2): see beast_http_server.h for what it does and does not do.
#include "beast_http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cctype>
#include <optional>
#include <stdexcept>
#include <utility>

namespace speedtorch::serving::prototype {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

struct BeastHttpServer::Impl {
  explicit Impl(BeastHttpServer& owner) : owner(owner), acceptor(ioc), guard(asio::make_work_guard(ioc)) {}
  BeastHttpServer& owner;
  asio::io_context ioc{1};
  tcp::acceptor acceptor;
  asio::executor_work_guard<asio::io_context::executor_type> guard;
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions;
  uint64_t next_id = 1;
  int64_t unanswered = 0;  // requests with the handler (loop thread only)
  bool stopping = false;

  void accept();
  void begin_stop();
  void maybe_finish() {
    if (stopping && unanswered == 0) guard.reset(), ioc.stop();
  }
};

struct BeastHttpServer::Session : std::enable_shared_from_this<Session> {
  Session(BeastHttpServer& server, tcp::socket socket, uint64_t id)
      : server(server), impl(*server.impl_), stream(std::move(socket)), id(id) {}

  BeastHttpServer& server;
  Impl& impl;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  std::optional<http::request_parser<http::string_body>> parser;
  http::response<http::string_body> answer;
  uint64_t id;
  bool keep_alive = true, http10 = false, head_only = false, processing = false;
  std::string method, path;  // of the request being answered, for the observer
  Clock::time_point whole_at;

  void read() {
    parser.emplace();
    parser->header_limit(static_cast<std::uint32_t>(server.options_.limits.max_head_bytes));
    parser->body_limit(static_cast<std::uint64_t>(server.options_.limits.max_body_bytes));
    stream.expires_after(seconds(server.options_.idle_timeout_s));
    http::async_read(stream, buffer, *parser,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::body_limit) return refuse(413, "the request body is over the limit");
    if (ec == http::error::header_limit) return refuse(431, "the request head is over the limit");
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      return close();
    }
    if (ec) return refuse(400, "malformed request");  // Beast's parse errors (bad_line_ending, bad_method, ...)
    auto& message = parser->get();
    HttpRequest request;
    request.method = std::string(message.method_string());
    request.target = std::string(message.target());
    request.path = request.target.substr(0, request.target.find('?'));
    request.minor_version = message.version() % 10;
    for (const auto& field : message) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      request.headers.emplace_back(std::move(name), std::string(field.value()));
    }
    request.keep_alive = message.keep_alive();
    if (request.method == "POST" && !parser->content_length() && !parser->chunked()) {
      return refuse(411, "a POST needs a Content-Length (or a chunked body)");
    }
    request.body = std::move(message.body());
    keep_alive = request.keep_alive;
    http10 = message.version() == 10;
    head_only = request.method == "HEAD";
    if (head_only) request.method = "GET";
    method = request.method;
    path = request.path;
    whole_at = Clock::now();
    processing = true;
    stream.expires_never();
    ++impl.unanswered;
    server.handler_(std::move(request), Responder(&server, id));
  }

  void refuse(int status, const std::string& message) {
    keep_alive = false;
    if (parser && parser->is_header_done()) {
      method = std::string(parser->get().method_string());
      path = std::string(parser->get().target());
    }
    send({status, "application/json", {}, "{\"error\": \"" + message + "\"}"}, /*refused=*/true);
  }

  void send(HttpResponse response, bool refused) {
    if (impl.stopping) keep_alive = false;
    answer = {};
    answer.version(11);
    answer.result(static_cast<unsigned>(response.status));
    answer.set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) answer.set(name, value);
    const std::size_t length = response.body.size();
    if (!head_only) answer.body() = std::move(response.body);
    answer.content_length(length);
    answer.keep_alive(keep_alive);
    if (keep_alive && http10) answer.set(http::field::connection, "keep-alive");
    if (server.observer_) {
      server.observer_(method, path, response.status,
                       refused ? -1 : std::chrono::duration<double>(Clock::now() - whole_at).count());
    }
    stream.expires_after(seconds(server.options_.write_timeout_s));
    http::async_write(stream, answer, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec || !self->keep_alive) return self->close();
      self->processing = false;
      self->read();  // a pipelined request may be in the buffer already
    });
  }

  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream.close();
    impl.sessions.erase(id);
  }
};

void BeastHttpServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (stopping) return;
    if (!ec) {
      socket.set_option(tcp::no_delay(true));
      auto session = std::make_shared<Session>(owner, std::move(socket), next_id++);
      sessions.emplace(session->id, session);
      session->read();
    }
    accept();
  });
}

void BeastHttpServer::Impl::begin_stop() {
  if (stopping) return;
  stopping = true;
  beast::error_code ignored;
  acceptor.close(ignored);
  std::vector<std::shared_ptr<Session>> idle;
  for (auto& [id, s] : sessions) {
    if (!s->processing) idle.push_back(s);
  }
  for (auto& s : idle) s->close();  // the busy ones close after their answer (stopping: Connection: close)
  maybe_finish();
}

BeastHttpServer::BeastHttpServer(HttpServerOptions options, HttpServer::Handler handler, HttpServer::Observer observer)
    : options_(std::move(options)), handler_(std::move(handler)), observer_(std::move(observer)),
      impl_(std::make_unique<Impl>(*this)) {
  tcp::resolver resolver(impl_->ioc);
  const auto found = resolver.resolve(options_.host, std::to_string(options_.port),
                                      tcp::resolver::passive | tcp::resolver::numeric_service);
  const tcp::endpoint endpoint = *found.begin();
  impl_->acceptor.open(endpoint.protocol());
  impl_->acceptor.set_option(asio::socket_base::reuse_address(true));
  impl_->acceptor.bind(endpoint);
  impl_->acceptor.listen(options_.backlog);
  port_ = impl_->acceptor.local_endpoint().port();
}

BeastHttpServer::~BeastHttpServer() = default;

void BeastHttpServer::run() {
  impl_->accept();
  impl_->ioc.run();
}

void BeastHttpServer::stop() {
  asio::post(impl_->ioc, [this] { impl_->begin_stop(); });
}

void BeastHttpServer::post(uint64_t id, HttpResponse response) {
  asio::post(impl_->ioc, [this, id, response = std::move(response)]() mutable {
    --impl_->unanswered;
    const auto it = impl_->sessions.find(id);
    if (it != impl_->sessions.end() && it->second->processing) it->second->send(std::move(response), false);
    impl_->maybe_finish();
  });
}

}  // namespace speedtorch::serving::prototype

// speedtorch_load_client: the load generator of load_test.py. Each client is a thread with one keep-alive
// connection (TCP_NODELAY) sending lookups, in the Open Inference Protocol with binary tensors (--protocol binary),
// its JSON form (v2json) or the server's own /lookup (json), mixed with /updates when asked, and checking every
// answer. Written in C++ so that 64 clients cost little next to the server (a Python thread per client is itself
// the limit at these rates); --path /v2/health/ready measures the client's own ceiling against a trivial endpoint.
// Usage: kUsage below (--help prints it).
//
// TABLE.f32: the user table the server was started with, N x D float32 (load_test.py writes it). Checks:
// - a row of an id that nobody updates (all but the hot ids) equals the table's row bit for bit;
// - /updates (every K-th request of a client) write rows of the hot ids [0, hot-ids), each owned by one client
//   (id % clients), as base + 0.25 j with base = 1e6 + 1e4 client + version (exact in float32); a row of a hot id
//   is whole (its row when the run began, or one update's row, never a mix), and its owner reads back exactly what
//   it wrote last. The hot rows are read from the server before the run: an earlier run against the same server
//   may have updated them.
// Prints one line of JSON: requests, seconds, req_per_s, p50_ms, p99_ms, wrong, errors, first_problem.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "command_line_numbers.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  int clients = 64;
  long requests = 1000;  // per client, when seconds == 0
  double seconds = 0;
  long warmup = 20;
  int ids = 16;
  std::string protocol = "binary";
  long update_every = 0;
  int hot_ids = 64;
  uint64_t seed = 0;
  std::string path;  // a GET endpoint: measure it instead of lookups
  bool keep_alive = true;  // false: a new connection per request (Connection: close), for comparison
  std::string expected;
  int64_t users = 0;
  int64_t dim = 0;
};

const char kUsage[] =
    "usage: speedtorch_load_client --port P --expected TABLE.f32 --users N --dim D [--host 127.0.0.1] [--clients 64]\n"
    "    [--requests 1000 | --seconds S] [--warmup 20] [--ids 16] [--protocol binary|v2json|json]\n"
    "    [--update-every K] [--hot-ids 64] [--seed 0] [--path /v2/health/ready] [--keep-alive 1]\n";

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "speedtorch_load_client: %s\n", message.c_str());
  std::exit(2);
}

// One keep-alive connection: sends a request, reads the answer (Content-Length framing, as the server sends).
class Connection {
 public:
  Connection(const std::string& host, int port) : host_(host), port_(port) {}
  ~Connection() { disconnect(); }

  // Returns false (and sets `problem`) on a transport failure; `status`, `headers` (lower-case names) and `body`
  // otherwise.
  bool exchange(const std::string& request, int& status, std::string& head, std::string& body, std::string& problem) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (fd_ < 0 && !connect_now(problem)) return false;
      if (send_all(request) && read_answer(status, head, body)) return true;
      disconnect();  // the server closed a kept-alive connection (idle): one retry on a new one
      if (attempt == 1) problem = "connection failed: " + std::string(std::strerror(errno));
    }
    return false;
  }

 private:
  bool connect_now(std::string& problem) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port_));
    inet_pton(AF_INET, host_.c_str(), &address.sin_addr);
    if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      problem = "cannot connect: " + std::string(std::strerror(errno));
      disconnect();
      return false;
    }
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return true;
  }
  void disconnect() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    buffer_.clear();
  }
  bool send_all(const std::string& data) {
    std::size_t sent = 0;
    while (sent < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }
  bool fill() {
    char chunk[65536];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<std::size_t>(n));
    return true;
  }
  bool read_answer(int& status, std::string& head, std::string& body) {
    std::size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) return false;
    }
    head = buffer_.substr(0, end + 2);
    buffer_.erase(0, end + 4);
    status = std::atoi(head.c_str() + 9);
    std::string lower = head;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const std::size_t at = lower.find("\r\ncontent-length:");
    const std::size_t length = at == std::string::npos ? 0 : std::strtoull(lower.c_str() + at + 17, nullptr, 10);
    while (buffer_.size() < length) {
      if (!fill()) return false;
    }
    body = buffer_.substr(0, length);
    buffer_.erase(0, length);
    if (lower.find("\r\nconnection: close") != std::string::npos) disconnect();
    head.swap(lower);
    return true;
  }

  std::string host_;
  int port_;
  int fd_ = -1;
  std::string buffer_;
};

bool g_keep_alive = true;

std::string http_request(const std::string& method, const std::string& path, const std::string& body,
                         const std::string& extra_headers = "") {
  return method + " " + path + " HTTP/1.1\r\nHost: load\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + (g_keep_alive ? "" : "Connection: close\r\n") + extra_headers +
         "\r\n" + body;
}

struct Result {
  std::vector<double> latencies;
  long wrong = 0;
  long errors = 0;
  std::string first_problem;
  void problem(bool is_wrong, const std::string& what) {
    (is_wrong ? wrong : errors) += 1;
    if (first_problem.empty()) first_problem = what;
  }
};

class Client {
 public:
  Client(const Options& o, const float* table, const float* hot_start, int index)
      : o_(o), table_(table), hot_start_(hot_start), index_(index), rng_(o.seed * 1000003 + index),
        connection_(o.host, o.port) {}

  // The server's rows of `ids`, read with one lookup of this client's protocol; false (and `problem`) on failure.
  bool read_rows(const std::vector<int64_t>& ids, std::vector<float>& rows, std::string& problem) {
    int status = 0;
    std::string head, body;
    if (!connection_.exchange(lookup_request(ids), status, head, body, problem)) return false;
    if (status != 200) return fail(problem, "status " + std::to_string(status) + ": " + body.substr(0, 200));
    return lookup_rows(head, body, ids.size(), rows, problem);
  }

  // One request; its latency goes to `result` when `timed`.
  void one(Result& result, bool timed) {
    ++count_;
    std::string request;
    enum { kGet, kLookup, kUpdate } kind;
    std::vector<int64_t> ids;
    int64_t updated_id = -1;
    float base = 0;
    if (!o_.path.empty()) {
      kind = kGet;
      request = http_request("GET", o_.path, "");
    } else if (o_.update_every > 0 && count_ % o_.update_every == 0 && index_ < o_.hot_ids) {
      kind = kUpdate;
      // A hot id this client owns: index, index + clients, ...
      const int owned = (o_.hot_ids - 1 - index_) / o_.clients + 1;
      updated_id = index_ + o_.clients * static_cast<int64_t>(rng_() % owned);
      base = 1e6f + 1e4f * index_ + static_cast<float>(++version_ % 9000);
      std::string row;
      char number[32];
      for (int64_t j = 0; j < o_.dim; ++j) {
        std::snprintf(number, sizeof number, "%s%.9g", j ? "," : "", base + 0.25f * j);
        row += number;
      }
      request = http_request("POST", "/update", "{\"ids\": [" + std::to_string(updated_id) + "], \"rows\": [[" + row + "]]}");
    } else {
      kind = kLookup;
      ids.resize(o_.ids);
      for (auto& id : ids) {
        // A quarter of the ids from the hot set, where updates race with reads.
        id = rng_() % 4 == 0 ? static_cast<int64_t>(rng_() % o_.hot_ids) : static_cast<int64_t>(rng_() % o_.users);
      }
      request = lookup_request(ids);
    }
    const auto start = Clock::now();
    int status = 0;
    std::string head, body, problem;
    if (!connection_.exchange(request, status, head, body, problem)) {
      result.problem(false, problem);
      return;
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (timed) result.latencies.push_back(elapsed);
    if (status != 200) {
      result.problem(true, "status " + std::to_string(status) + ": " + body.substr(0, 200));
      return;
    }
    if (kind == kUpdate) {
      if (body != "{\"updated\":1}") result.problem(true, "update answered " + body.substr(0, 200));
      else written_[updated_id] = base;
    } else if (kind == kLookup) {
      std::vector<float> rows;
      if (!lookup_rows(head, body, ids.size(), rows, problem)) result.problem(true, problem);
      else if (!check_rows(ids, rows, problem)) result.problem(true, problem);
    }
  }

 private:
  std::string lookup_request(const std::vector<int64_t>& ids) {
    std::string list;
    for (std::size_t i = 0; i < ids.size(); ++i) list += (i ? "," : "") + std::to_string(ids[i]);
    if (o_.protocol == "json") return http_request("POST", "/lookup", "{\"ids\": [" + list + "]}");
    if (o_.protocol == "v2json") {
      return http_request("POST", "/v2/models/lookup/infer",
                          "{\"inputs\": [{\"name\": \"ids\", \"shape\": [" + std::to_string(ids.size()) +
                              "], \"datatype\": \"INT64\", \"data\": [" + list + "]}]}");
    }
    const std::string header = "{\"inputs\": [{\"name\": \"ids\", \"shape\": [" + std::to_string(ids.size()) +
                               "], \"datatype\": \"INT64\", \"parameters\": {\"binary_data_size\": " +
                               std::to_string(8 * ids.size()) +
                               "}}], \"outputs\": [{\"name\": \"rows\", \"parameters\": {\"binary_data\": true}}]}";
    std::string body = header;
    body.append(reinterpret_cast<const char*>(ids.data()), 8 * ids.size());
    return http_request("POST", "/v2/models/lookup/infer", body,
                        "Inference-Header-Content-Length: " + std::to_string(header.size()) + "\r\n");
  }

  bool lookup_rows(const std::string& head, const std::string& body, std::size_t count, std::vector<float>& rows,
                   std::string& problem) {
    const std::size_t want = count * static_cast<std::size_t>(o_.dim);
    try {
      if (o_.protocol == "binary") {
        const std::size_t at = head.find("\r\ninference-header-content-length:");
        if (at == std::string::npos) {
          problem = "binary answer without Inference-Header-Content-Length";
          return false;
        }
        const std::size_t length = std::strtoull(head.c_str() + at + 35, nullptr, 10);
        const json header = json::parse(body.substr(0, length));
        const auto& output = header.at("outputs").at(0);
        if (output.at("shape") != json::array({count, o_.dim}) || body.size() != length + 4 * want) {
          problem = "binary answer of the wrong shape: " + header.dump().substr(0, 200);
          return false;
        }
        rows.resize(want);
        std::memcpy(rows.data(), body.data() + length, 4 * want);
        return true;
      }
      const json answer = json::parse(body);
      if (o_.protocol == "v2json") {
        rows = answer.at("outputs").at(0).at("data").get<std::vector<float>>();
      } else {
        for (const auto& row : answer.at("rows")) {
          for (const auto& v : row) rows.push_back(v.get<float>());
        }
      }
    } catch (const std::exception& e) {
      problem = std::string("unreadable answer: ") + e.what();
      return false;
    }
    if (rows.size() != want) {
      problem = "answer of " + std::to_string(rows.size()) + " values, not " + std::to_string(want);
      return false;
    }
    return true;
  }

  bool check_rows(const std::vector<int64_t>& ids, const std::vector<float>& rows, std::string& problem) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const float* got = rows.data() + i * o_.dim;
      const float* original = (ids[i] < o_.hot_ids ? hot_start_ : table_) + ids[i] * o_.dim;
      const bool same_as_table = std::memcmp(got, original, 4 * o_.dim) == 0;
      if (ids[i] >= o_.hot_ids) {
        if (!same_as_table) return fail(problem, "row of id " + std::to_string(ids[i]) + " differs from the table");
        continue;
      }
      // A hot id: whole rows only; its owner reads back its own last write.
      bool whole_update = got[0] >= 1e6f;
      for (int64_t j = 0; j < o_.dim && whole_update; ++j) whole_update = got[j] == got[0] + 0.25f * j;
      if (!same_as_table && !whole_update) {
        return fail(problem, "torn or wrong row of hot id " + std::to_string(ids[i]));
      }
      const auto mine = written_.find(ids[i]);
      if (mine != written_.end() && !(whole_update && got[0] == mine->second)) {
        return fail(problem, "id " + std::to_string(ids[i]) + " does not read back its owner's last update");
      }
      if (ids[i] % o_.clients == index_ && mine == written_.end() && !same_as_table) {
        return fail(problem, "id " + std::to_string(ids[i]) + " changed though its only writer never wrote it");
      }
    }
    return true;
  }
  static bool fail(std::string& problem, std::string what) {
    problem = std::move(what);
    return false;
  }

  const Options& o_;
  const float* table_;
  const float* hot_start_;  // the hot ids' rows when the run began
  int index_;
  std::mt19937_64 rng_;
  Connection connection_;
  long count_ = 0;
  long version_ = 0;
  std::unordered_map<int64_t, float> written_;  // hot ids this client owns: the base of its last update
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) die("option " + flag + " needs a value");
    const std::string v = argv[i + 1];
    const auto number = [&](long long min, long long max) {
      const auto x = speedtorch::examples::whole_integer(v, min, max);
      if (!x) die(flag + ": not an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]: " + v);
      return *x;
    };
    if (flag == "--host") o.host = v;
    else if (flag == "--port") o.port = static_cast<int>(number(1, 65535));
    else if (flag == "--clients") o.clients = static_cast<int>(number(1, 4096));
    else if (flag == "--requests") o.requests = static_cast<long>(number(1, 1ll << 40));
    else if (flag == "--seconds") o.seconds = static_cast<double>(number(1, 3600));
    else if (flag == "--warmup") o.warmup = static_cast<long>(number(0, 1 << 20));
    else if (flag == "--ids") o.ids = static_cast<int>(number(1, 1 << 20));
    else if (flag == "--protocol") o.protocol = v;
    else if (flag == "--update-every") o.update_every = static_cast<long>(number(0, 1 << 30));
    else if (flag == "--hot-ids") o.hot_ids = static_cast<int>(number(1, 1 << 30));
    else if (flag == "--seed") o.seed = static_cast<uint64_t>(number(0, 1ll << 62));
    else if (flag == "--path") o.path = v;
    else if (flag == "--keep-alive") o.keep_alive = number(0, 1) == 1;
    else if (flag == "--expected") o.expected = v;
    else if (flag == "--users") o.users = number(1, 1ll << 40);
    else if (flag == "--dim") o.dim = number(1, 1 << 16);
    else die("unknown option " + flag);
  }
  if (o.port == 0) die("--port is required");
  if (o.protocol != "binary" && o.protocol != "v2json" && o.protocol != "json") die("--protocol: binary, v2json or json");
  if (o.path.empty() && (o.expected.empty() || o.users == 0 || o.dim == 0)) {
    die("lookups are checked: give --expected TABLE.f32 --users N --dim D");
  }
  o.hot_ids = static_cast<int>(std::min<int64_t>(o.hot_ids, std::max<int64_t>(o.users, 1)));
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  g_keep_alive = o.keep_alive;
  const float* table = nullptr;
  if (!o.expected.empty()) {
    const int fd = open(o.expected.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size != o.users * o.dim * 4) {
      die(o.expected + " must hold users x dim float32 values");
    }
    void* mapped = mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapped == MAP_FAILED) die("cannot map " + o.expected);
    table = static_cast<const float*>(mapped);
  }
  // The hot rows as the server holds them now, read in requests of --ids ids (what the server takes per request).
  std::vector<float> hot_start;
  if (o.path.empty()) {
    Client reader(o, table, nullptr, 0);
    std::string problem;
    for (int64_t first = 0; first < o.hot_ids; first += o.ids) {
      std::vector<int64_t> ids;
      for (int64_t id = first; id < std::min<int64_t>(first + o.ids, o.hot_ids); ++id) ids.push_back(id);
      std::vector<float> rows;
      if (!reader.read_rows(ids, rows, problem)) die("reading the hot rows before the run: " + problem);
      hot_start.insert(hot_start.end(), rows.begin(), rows.end());
    }
  }
  std::vector<Result> results(o.clients);
  std::atomic<int> warmed{0};
  std::atomic<bool> go{false};
  Clock::time_point start, end;
  std::vector<std::thread> threads;
  for (int c = 0; c < o.clients; ++c) {
    threads.emplace_back([&, c] {
      Client client(o, table, hot_start.data(), c);
      for (long i = 0; i < o.warmup; ++i) client.one(results[c], false);
      ++warmed;
      while (!go.load()) std::this_thread::yield();
      if (o.seconds > 0) {
        const auto stop = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
        while (Clock::now() < stop) client.one(results[c], true);
      } else {
        for (long i = 0; i < o.requests; ++i) client.one(results[c], true);
      }
    });
  }
  while (warmed.load() < o.clients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  start = Clock::now();
  go = true;
  for (std::thread& t : threads) t.join();
  end = Clock::now();
  std::vector<double> all;
  long wrong = 0, errors = 0;
  std::string first;
  for (const Result& r : results) {
    all.insert(all.end(), r.latencies.begin(), r.latencies.end());
    wrong += r.wrong;
    errors += r.errors;
    if (first.empty()) first = r.first_problem;
  }
  std::sort(all.begin(), all.end());
  const double seconds = std::chrono::duration<double>(end - start).count();
  const auto percentile = [&](double p) {
    return all.empty() ? 0.0 : 1e3 * all[std::min(all.size() - 1, static_cast<std::size_t>(p * all.size()))];
  };
  std::printf("%s\n", json{{"requests", all.size()}, {"seconds", seconds}, {"req_per_s", all.size() / seconds},
                           {"p50_ms", percentile(0.5)}, {"p99_ms", percentile(0.99)}, {"wrong", wrong},
                           {"errors", errors}, {"first_problem", first}}.dump().c_str());
  return wrong + errors == 0 ? 0 : 1;
}

#include "server/metrics_http.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/common/log.h"

namespace memprofd {
namespace {

// One client connection: its request head as it arrives, then its answer
// as it leaves, then (lingering) what it still sends until it closes, so
// that closing does not reset the connection under an answer still in
// flight.
struct Connection {
  enum class State { kReading, kWriting, kLingering };
  State state = State::kReading;
  std::string in;
  std::string out;
  size_t sent = 0;
  absl::Time deadline;
};

constexpr absl::Duration kLinger = absl::Seconds(1);

std::string Answer(int code, absl::string_view reason, absl::string_view content_type,
                   absl::string_view body, bool head_only) {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", head_only ? "" : body);
}

std::string Plain(int code, absl::string_view reason, absl::string_view body) {
  return Answer(code, reason, "text/plain; charset=utf-8", body, false);
}

// The answer to a complete request head.
std::string Respond(absl::string_view head, const std::function<std::string()>& render) {
  const absl::string_view line = head.substr(0, head.find_first_of("\r\n"));
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
    return Plain(400, "Bad Request", "not an HTTP/1 request line\n");
  }
  const absl::string_view method = parts[0];
  const absl::string_view path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics") return Plain(404, "Not Found", "the metrics are at /metrics\n");
  if (method != "GET" && method != "HEAD") {
    return Plain(405, "Method Not Allowed", "use GET\n");
  }
  std::string body;
  try {
    body = render();
  } catch (const std::exception& e) {
    LogWarning(absl::StrCat("metrics server: rendering the metrics failed: ", e.what()));
    return Plain(500, "Internal Server Error", "rendering the metrics failed\n");
  }
  return Answer(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body,
                method == "HEAD");
}

// The end of the request head in `in`, or npos while it is incomplete.
size_t HeadEnd(const std::string& in) {
  const size_t crlf = in.find("\r\n\r\n");
  if (crlf != std::string::npos) return crlf + 4;
  const size_t lf = in.find("\n\n");
  return lf == std::string::npos ? lf : lf + 2;
}

// A bound, listening, non-blocking socket for `listen`, and its port.
absl::StatusOr<std::pair<int, int>> Listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  const std::string port = colon == std::string::npos ? listen : listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(),
                                   &hints, &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", listen, ": ", ::gai_strerror(rc)));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    const int bound_port =
        bound.ss_family == AF_INET6
            ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
            : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    ::freeaddrinfo(found);
    return std::make_pair(fd, bound_port);
  }
  ::freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, ": ", why));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Create(
    const std::string& listen, std::function<std::string()> render) {
  absl::StatusOr<std::pair<int, int>> bound = Listen(listen);
  if (!bound.ok()) return bound.status();
  const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int epoll = ::epoll_create1(EPOLL_CLOEXEC);
  if (wake < 0 || epoll < 0) {
    const int err = errno;
    for (int fd : {bound->first, wake, epoll}) {
      if (fd >= 0) ::close(fd);
    }
    return absl::UnavailableError(
        absl::StrCat("metrics server: epoll or eventfd: ", std::strerror(err)));
  }
  for (int fd : {bound->first, wake}) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    ::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &e);
  }
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(bound->first, wake, epoll, bound->second, std::move(render)));
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_fd, int epoll_fd, int port,
                                     std::function<std::string()> render)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      epoll_fd_(epoll_fd),
      port_(port),
      render_(std::move(render)) {}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  ::close(epoll_fd_);
  ::close(wake_fd_);
  ::close(listen_fd_);
}

void MetricsHttpServer::Loop() {
  std::unordered_map<int, Connection> connections;
  auto drop = [&](int fd) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    connections.erase(fd);
  };
  auto watch = [&](int fd, uint32_t events) {
    epoll_event e{};
    e.events = events;
    e.data.fd = fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &e);
  };
  // Sends what is left of `c`'s answer; once all is out, lingers.
  auto send_rest = [&](int fd, Connection& c) {
    while (c.sent < c.out.size()) {
      const ssize_t n =
          ::send(fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n <= 0) {
        drop(fd);
        return;
      }
      c.sent += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    c.state = Connection::State::kLingering;
    c.out.clear();
    c.deadline = absl::Now() + kLinger;
    watch(fd, EPOLLIN);
  };
  auto answer = [&](int fd, Connection& c, std::string out) {
    c.out = std::move(out);
    c.in.clear();
    c.state = Connection::State::kWriting;
    c.deadline = absl::Now() + kWriteTimeout;
    watch(fd, EPOLLOUT);
    send_rest(fd, c);
  };
  std::vector<epoll_event> events(64);
  while (true) {
    int timeout_ms = -1;
    if (!connections.empty()) {
      absl::Time next = absl::InfiniteFuture();
      for (const auto& [fd, c] : connections) next = std::min(next, c.deadline);
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(next - absl::Now()) + 1, 0, 1000));
    }
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                               timeout_ms);
    if (n < 0 && errno != EINTR) {
      LogWarning(absl::StrCat("metrics server: epoll_wait: ", std::strerror(errno)));
      break;
    }
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        for (const auto& [open, c] : connections) ::close(open);
        return;
      }
      if (fd == listen_fd_) {
        while (true) {
          const int client =
              ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (client < 0) break;  // EAGAIN, or a client gone before its accept
          if (static_cast<int>(connections.size()) >= kMaxConnections) {
            const std::string busy =
                Plain(503, "Service Unavailable", "too many connections; retry\n");
            (void)!::send(client, busy.data(), busy.size(), MSG_NOSIGNAL);
            ::close(client);
            continue;
          }
          Connection& c = connections[client];
          c.deadline = absl::Now() + kHeaderTimeout;
          epoll_event e{};
          e.events = EPOLLIN;
          e.data.fd = client;
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, client, &e);
        }
        continue;
      }
      auto it = connections.find(fd);
      if (it == connections.end()) continue;
      Connection& c = it->second;
      if (c.state == Connection::State::kWriting) {
        if (events[i].events & (EPOLLERR | EPOLLHUP)) {
          drop(fd);
        } else {
          send_rest(fd, c);
        }
        continue;
      }
      // Reading a request head, or lingering: read what there is.
      char buffer[4096];
      bool closed = false;
      while (true) {
        const ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (got <= 0) {
          closed = true;
          break;
        }
        if (c.state == Connection::State::kReading) {
          c.in.append(buffer, static_cast<size_t>(got));
          if (static_cast<int64_t>(c.in.size()) > kMaxRequestBytes) break;
        }
      }
      if (closed) {
        drop(fd);
        continue;
      }
      if (c.state != Connection::State::kReading) continue;
      const size_t end = HeadEnd(c.in);
      if (end != std::string::npos && static_cast<int64_t>(end) <= kMaxRequestBytes) {
        answer(fd, c, Respond(absl::string_view(c.in).substr(0, end), render_));
      } else if (static_cast<int64_t>(c.in.size()) > kMaxRequestBytes) {
        answer(fd, c, Plain(400, "Bad Request", "request head too large\n"));
      }
    }
    // Deadlines: an idle or slow client lets go of nothing but its socket,
    // and only until then.
    const absl::Time now = absl::Now();
    std::vector<int> expired;
    for (const auto& [fd, c] : connections) {
      if (c.deadline <= now) expired.push_back(fd);
    }
    for (int fd : expired) drop(fd);
  }
  for (const auto& [open, c] : connections) ::close(open);
}

}  // namespace memprofd

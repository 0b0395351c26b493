#ifndef MEMPROFD_SERVER_METRICS_HTTP_H_
#define MEMPROFD_SERVER_METRICS_HTTP_H_

// The HTTP side of /metrics: one thread, one epoll loop, every connection a
// few hundred bytes of state. A thread-per-connection server (CivetWeb, which
// prometheus-cpp's Exposer runs) lets idle or slow clients hold its threads:
// 40 idle sockets kept open made every scrape time out. Here an idle or slow
// connection costs a file descriptor until its deadline, and a scrape is
// answered as soon as its request line and headers are in, whatever else is
// connected.
//
// What it speaks: HTTP/1.0 and 1.1 GET and HEAD of /metrics (any query
// string), answered with the body `render` makes and Connection: close; 404
// for other paths, 405 for other methods, 400 for anything unparsable or a
// request head over kMaxRequestBytes, 503 while kMaxConnections are open.
// A connection must send its request head within kHeaderTimeout and take
// its answer within kWriteTimeout, or it is closed.
//
// Thread-safety: Create, port and the destructor from one thread; `render`
// runs on the server's own thread.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace memprofd {

class MetricsHttpServer {
 public:
  // A request head larger than this is refused (400).
  static constexpr int64_t kMaxRequestBytes = 8 << 10;
  // Connections open at once; one more is answered 503 and closed.
  static constexpr int kMaxConnections = 1024;
  static constexpr absl::Duration kHeaderTimeout = absl::Seconds(2);
  static constexpr absl::Duration kWriteTimeout = absl::Seconds(10);

  // Binds `listen` ("host:port", "[v6]:port"; port 0 picks one, as
  // ValidateListenAddress accepts) and starts serving. UNAVAILABLE naming
  // the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Create(
      const std::string& listen, std::function<std::string()> render);
  // Stops the loop and closes every connection.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(int listen_fd, int wake_fd, int epoll_fd, int port,
                    std::function<std::string()> render);
  void Loop();

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written to stop the loop
  const int epoll_fd_;
  const int port_;
  const std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_METRICS_HTTP_H_

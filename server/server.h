#ifndef MEMPROFD_SERVER_SERVER_H_
#define MEMPROFD_SERVER_SERVER_H_

// The memprofd process minus flag parsing: the engine session, the gRPC
// server (service, health, reflection), the metrics endpoint, and orderly
// shutdown. Thread-compatible: Start, then Wait from one thread; Shutdown
// may be called from any thread (the signal thread).

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/session/session.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/service.h"

namespace memprofd {

class Server {
 public:
  // `runtime`: the process's (Runtime::Install(), made once by main); it
  // outlives the server.
  Server(ServerOptions options, Runtime& runtime);
  ~Server();

  // Validates the options, creates the session, binds both ports and writes
  // the port file. The status says what to fix: INVALID_ARGUMENT for bad
  // addresses or options, FAILED_PRECONDITION for unreadable files,
  // UNAVAILABLE when a port cannot be bound.
  absl::Status Start();

  // Blocks until Shutdown has completed.
  void Wait();

  // Health NOT_SERVING, new work refused, active operations cancelled at
  // their next step boundary, in-flight calls given the grace period.
  // Idempotent.
  void Shutdown();

  // What the process should exit with once Wait returns: 0, or 1 when a
  // data-parallel run broke (so that torchrun or Kubernetes restarts every
  // rank).
  int exit_code();

  int grpc_port() const { return grpc_port_; }
  // The engine; null before Start. For tests and the signal path.
  Session* session() { return session_.get(); }
  int metrics_port() const { return metrics_port_; }

 private:
  absl::Status WritePortFile() const;
  // The session's run ended under it (Session::SetFatalHandler): health
  // NOT_SERVING at once, then Shutdown on a thread of its own.
  void OnRunEnded(const absl::Status& status);

  const ServerOptions options_;
  Runtime& runtime_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<TokenAuth> auth_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<MemprofdService> service_;
  std::unique_ptr<grpc::Server> server_;
  int grpc_port_ = 0;
  int metrics_port_ = 0;

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  int exit_code_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread stopper_ ABSL_GUARDED_BY(mu_);
};

// The service name health answers for besides "".
inline constexpr char kServiceName[] = "memprofd.v1.Memprofd";

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_SERVER_H_

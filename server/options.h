#ifndef MEMPROFD_SERVER_OPTIONS_H_
#define MEMPROFD_SERVER_OPTIONS_H_

// Everything the daemon can be told at start, with its defaults. main() fills
// it from flags; tests fill it directly.

#include <string>

#include "core/session/session.h"

namespace memprofd {

struct ServerOptions {
  // gRPC address, host:port; port 0 picks a free one (see port_file).
  std::string listen = "127.0.0.1:50051";
  // Prometheus /metrics address, host:port; port 0 picks a free one.
  std::string metrics_listen = "127.0.0.1:9464";
  // When set, the bound ports are written there as JSON once serving:
  // {"grpc_port": N, "metrics_port": M}.
  std::string port_file;
  // When set, every RPC except health needs "authorization: Bearer <token>"
  // with the file's first line as the token.
  std::string auth_token_file;
  // TLS: both or neither.
  std::string tls_cert;
  std::string tls_key;
  // The engine: device, start model, snapshots, offload defaults.
  SessionOptions session;
  // On SIGTERM, take a blocking snapshot named "shutdown-<unix time>" before
  // stopping (needs session.snapshot_root).
  bool snapshot_on_shutdown = false;
  // Seconds in-flight calls get to finish after SIGTERM.
  double shutdown_grace_seconds = 3.0;
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_OPTIONS_H_

#ifndef MEMPROFD_CLIENT_CLIENT_H_
#define MEMPROFD_CLIENT_CLIENT_H_

// A small client library over the memprofd v1 API: a channel to one daemon,
// stubs, and contexts that carry the bearer token. memprofctl and the C++
// integration tests use it. Thread-safe after Create.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "memprofd/v1/memprofd.grpc.pb.h"

namespace memprofd {

struct ClientOptions {
  std::string addr = "127.0.0.1:50051";
  // File whose first line is the bearer token; empty for none.
  std::string token_file;
  // PEM root certificates: when set, the channel uses TLS.
  std::string tls_ca_file;
};

class Client {
 public:
  // FAILED_PRECONDITION when the token or CA file cannot be read.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const ClientOptions& options);

  v1::Memprofd::Stub& stub() { return *stub_; }
  grpc::health::v1::Health::Stub& health() { return *health_; }

  // A context with the token and, when `timeout` is positive, a deadline.
  std::unique_ptr<grpc::ClientContext> NewContext(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const;

 private:
  Client(std::shared_ptr<grpc::Channel> channel, std::string token);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Memprofd::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  const std::string token_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CLIENT_CLIENT_H_

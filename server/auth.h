#ifndef MEMPROFD_SERVER_AUTH_H_
#define MEMPROFD_SERVER_AUTH_H_

// Bearer-token check of the "authorization" call metadata. Without TLS,
// gRPC's AuthMetadataProcessor cannot be used, so every handler asks this.
// Thread-safe (immutable after Create).

#include <grpcpp/server_context.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace memprofd {

class TokenAuth {
 public:
  // An empty path disables auth. The token is the file's first line, trimmed.
  // FAILED_PRECONDITION when the file cannot be read, is not a regular file,
  // holds no token, or other users may read or write it (mode & 0027: only
  // the owner and, read-only, its group may; say chmod 600).
  static absl::StatusOr<std::unique_ptr<TokenAuth>> Create(const std::string& token_file);

  bool enabled() const { return !token_.empty(); }

  // OK, or UNAUTHENTICATED saying what is missing. The token is compared in
  // time that depends only on its own length.
  absl::Status Check(const grpc::ServerContextBase& context) const;

 private:
  explicit TokenAuth(std::string token) : token_(std::move(token)) {}
  const std::string token_;
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_AUTH_H_

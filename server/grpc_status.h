#ifndef MEMPROFD_SERVER_GRPC_STATUS_H_
#define MEMPROFD_SERVER_GRPC_STATUS_H_

// The one translation point from absl::Status to grpc::Status. absl's codes
// equal gRPC's numerically, so names come from absl::StatusCodeToString.

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace memprofd {

grpc::Status ToGrpcStatus(const absl::Status& status);

// "OK", "INVALID_ARGUMENT", ... for a gRPC code (metrics labels).
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_GRPC_STATUS_H_

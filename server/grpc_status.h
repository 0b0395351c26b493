#ifndef MEMPROFD_SERVER_GRPC_STATUS_H_
#define MEMPROFD_SERVER_GRPC_STATUS_H_

// The one translation point from absl::Status to grpc::Status. absl's codes
// equal gRPC's numerically, so names come from absl::StatusCodeToString.

#include <grpcpp/support/status.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// The message is bounded (BoundedStatusMessage): gRPC sends it as metadata,
// and one over the client's metadata limit (8 to 16 KiB) reaches the client
// as RESOURCE_EXHAUSTED instead of the real status.
grpc::Status ToGrpcStatus(const absl::Status& status);

inline constexpr size_t kMaxStatusMessageBytes = 2048;

// `message` as valid UTF-8 (bad bytes as U+FFFD), cut at a character
// boundary to at most kMaxStatusMessageBytes plus a note of how much was cut.
std::string BoundedStatusMessage(absl::string_view message);

// "OK", "INVALID_ARGUMENT", ... for a gRPC code (metrics labels).
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_GRPC_STATUS_H_

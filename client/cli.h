#ifndef MEMPROFD_CLIENT_CLI_H_
#define MEMPROFD_CLIENT_CLI_H_

// Shared pieces of memprofctl's subcommands: exit codes, output helpers.

#include <google/protobuf/message.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/strings/string_view.h"

namespace memprofd::cli {

// Exit codes scripts can rely on.
inline constexpr int kExitOk = 0;
inline constexpr int kExitRpcError = 1;         // the daemon answered with an error
inline constexpr int kExitUsage = 2;            // bad command line
inline constexpr int kExitUnreachable = 3;      // no daemon answered
inline constexpr int kExitOperationFailed = 4;  // the operation ended FAILED or CANCELLED

// Prints "memprofctl: <what>: CODE: message" to stderr and returns the exit
// code for `status` (kExitUnreachable for UNAVAILABLE/DEADLINE_EXCEEDED).
int ReportRpcError(absl::string_view what, const grpc::Status& status);

// One JSON object on one line, proto field names, default values included.
std::string ToJsonLine(const google::protobuf::Message& message);

// 1536 -> "1.5 KiB".
std::string HumanBytes(double bytes);

}  // namespace memprofd::cli

#endif  // MEMPROFD_CLIENT_CLI_H_

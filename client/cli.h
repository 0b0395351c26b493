#ifndef MEMPROFD_CLIENT_CLI_H_
#define MEMPROFD_CLIENT_CLI_H_

// Shared pieces of memprofctl's subcommands: exit codes, output helpers.

#include <google/protobuf/message.h>
#include <grpcpp/support/status.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/client.h"

namespace memprofd::cli {

using Args = std::vector<std::string>;

// What every command gets.
struct Context {
  Client* client = nullptr;
  bool json = false;
  std::chrono::milliseconds timeout{10000};
};

// The commands (each returns the process's exit code).
int StatusCommand(const Context& c, const Args& args);
int HealthCommand(const Context& c, const Args& args);
int OperationsCommand(const Context& c, const Args& args);
int LoadCommand(const Context& c, const Args& args);
int ModelCommand(const Context& c, const Args& args);
int TrainCommand(const Context& c, const Args& args);
int SnapshotCommand(const Context& c, const Args& args);
int SnapshotsCommand(const Context& c, const Args& args);
int MemoryCommand(const Context& c, const Args& args);
// memory top / memory diff A B (commands_memory_top.cc).
int MemoryTopCommand(const Context& c, const Args& args);
int MemoryDiffCommand(const Context& c, const Args& args);
int EvaluateCommand(const Context& c, const Args& args);
// plan (commands_plan.cc): a memory plan of one training step.
int PlanCommand(const Context& c, const Args& args);

// The TrainRequest fields whose flags were given (request_fields.h's table,
// the short aliases, the data sources and the offload options) into `req`,
// for train and plan; steps and resume are the caller's. False, with
// *error set to the usage message, for contradicting or malformed flags.
bool TrainRequestFromFlags(v1::TrainRequest* req, std::string* error);

// A DataSource from a text-file flag's and a token-file flag's values (both
// empty: left unset, the embedded corpus; text "embedded": the embedded
// corpus, said so); --bytes_per_token goes with the token file. False, with
// *error set, when both are given.
bool DataSourceFromFlags(const std::string& text_file, const std::string& token_file,
                         v1::DataSource* source, std::string* error);

// Prints `message` and the usage summary to stderr; returns kExitUsage.
int Usage(const std::string& message);

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

// One line per operation (or its JSON with --json).
void PrintOperation(const Context& c, const v1::Operation& op);
// kExitOperationFailed for a FAILED or CANCELLED operation, else kExitOk.
int ExitForOperation(const v1::Operation& op);
// Waits (server-side WaitOperation slices) until `id` is done.
grpc::Status WaitForOperation(const Context& c, const std::string& id, v1::Operation* op);

}  // namespace memprofd::cli

#endif  // MEMPROFD_CLIENT_CLI_H_

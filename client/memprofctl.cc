// memprofctl: the command-line client of memprofd.
//
//   memprofctl [flags] <command> [args] [flags]
//
// Flags may stand before or after the command. Exit codes: see client/cli.h.

#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/client.h"

ABSL_FLAG(std::string, addr, "127.0.0.1:50051", "memprofd's gRPC address");
ABSL_FLAG(std::string, token_file, "", "file whose first line is the bearer token");
ABSL_FLAG(std::string, tls_ca, "", "PEM root certificates; use TLS when set");
ABSL_FLAG(bool, json, false, "print JSON (proto field names), one object per line");
ABSL_FLAG(int64_t, timeout_ms, 10000, "deadline of each unary call, in milliseconds");
ABSL_FLAG(std::string, service, "",
          "health: the service to ask about (\"\" = the server)");

namespace memprofd::cli {
namespace {

using Args = std::vector<std::string>;

struct Context {
  Client* client;
  bool json;
  std::chrono::milliseconds timeout;
};

int Usage(const std::string& message) {
  std::fprintf(stderr, "memprofctl: %s\n%s", message.c_str(),
               "usage: memprofctl [--addr=HOST:PORT] [--token_file=F] [--json] COMMAND\n"
               "commands:\n"
               "  status                      build, device, model, uptime\n"
               "  health [--service=NAME]     SERVING (exit 0) or not (exit 1)\n"
               "  operations [list]           known operations, newest first\n"
               "  operations get|wait|watch|cancel ID\n");
  return kExitUsage;
}

std::string OperationLine(const v1::Operation& op) {
  std::string line = absl::StrFormat(
      "%-8s %-10s %-10s %d/%d %s", op.id(),
      v1::OperationKind_Name(op.kind()).substr(sizeof("OPERATION_KIND_") - 1),
      v1::OperationState_Name(op.state()).substr(sizeof("OPERATION_STATE_") - 1),
      op.progress().completed(), op.progress().total(), op.progress().unit());
  if (!op.progress().message().empty())
    absl::StrAppend(&line, "  ", op.progress().message());
  if (op.has_error()) absl::StrAppend(&line, "  error: ", op.error().message());
  return line;
}

void PrintOperation(const Context& c, const v1::Operation& op) {
  std::printf("%s\n", c.json ? ToJsonLine(op).c_str() : OperationLine(op).c_str());
}

int ExitForOperation(const v1::Operation& op) {
  return op.done() && op.state() != v1::OPERATION_STATE_SUCCEEDED ? kExitOperationFailed
                                                                  : kExitOk;
}

int Status(const Context& c, const Args&) {
  v1::ServerStatus status;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->stub().GetStatus(ctx.get(), v1::GetStatusRequest(), &status);
  if (!s.ok()) return ReportRpcError("status", s);
  if (c.json) {
    std::printf("%s\n", ToJsonLine(status).c_str());
    return kExitOk;
  }
  const auto& b = status.build();
  std::printf("memprofd %s (LibTorch %s, gRPC %s, %s%s)\n", b.version().c_str(),
              b.torch_version().c_str(), b.grpc_version().c_str(), b.build_type().c_str(),
              b.cuda_compiled() ? ", CUDA" : "");
  std::printf("state:      %s, up %.0f s\n", status.serving_state().c_str(),
              status.uptime_seconds());
  std::printf("device:     %s\n", status.device().c_str());
  if (status.has_model()) {
    const auto& m = status.model();
    std::printf("model:      %s, %lld parameters (%s), %lld steps trained\n",
                m.source().c_str(), static_cast<long long>(m.num_parameters()),
                HumanBytes(static_cast<double>(m.parameter_bytes())).c_str(),
                static_cast<long long>(m.steps_trained()));
  } else {
    std::printf("model:      none loaded\n");
  }
  std::printf("operations: %lld active\n",
              static_cast<long long>(status.active_operations()));
  std::string features;
  for (const auto& f : b.features())
    absl::StrAppend(&features, features.empty() ? "" : ", ", f);
  std::printf("features:   %s\n", features.c_str());
  return kExitOk;
}

int Health(const Context& c, const Args&) {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = c.client->NewContext(c.timeout);
  grpc::Status s = c.client->health().Check(ctx.get(), req, &resp);
  if (!s.ok()) return ReportRpcError("health", s);
  const std::string state =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  if (c.json) {
    std::printf("%s\n", ToJsonLine(resp).c_str());
  } else {
    std::printf("%s\n", state.c_str());
  }
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk
                                                                         : kExitRpcError;
}

int Operations(const Context& c, const Args& args) {
  const std::string verb = args.empty() ? "list" : args[0];
  if (verb == "list") {
    v1::ListOperationsResponse resp;
    auto ctx = c.client->NewContext(c.timeout);
    grpc::Status s =
        c.client->stub().ListOperations(ctx.get(), v1::ListOperationsRequest(), &resp);
    if (!s.ok()) return ReportRpcError("operations list", s);
    for (const auto& op : resp.operations()) PrintOperation(c, op);
    return kExitOk;
  }
  if (args.size() != 2) return Usage(absl::StrCat("operations ", verb, " needs an ID"));
  const std::string& id = args[1];
  v1::Operation op;
  grpc::Status s;
  if (verb == "get") {
    v1::GetOperationRequest req;
    req.set_id(id);
    auto ctx = c.client->NewContext(c.timeout);
    s = c.client->stub().GetOperation(ctx.get(), req, &op);
  } else if (verb == "cancel") {
    v1::CancelOperationRequest req;
    req.set_id(id);
    auto ctx = c.client->NewContext(c.timeout);
    s = c.client->stub().CancelOperation(ctx.get(), req, &op);
  } else if (verb == "wait") {
    // Waits as long as it takes, in server-side slices of up to 60 s.
    for (;;) {
      v1::WaitOperationRequest req;
      req.set_id(id);
      auto ctx = c.client->NewContext(std::chrono::milliseconds(70000));
      s = c.client->stub().WaitOperation(ctx.get(), req, &op);
      if (!s.ok() || op.done()) break;
    }
  } else if (verb == "watch") {
    v1::WatchOperationRequest req;
    req.set_id(id);
    auto ctx = c.client->NewContext();
    auto reader = c.client->stub().WatchOperation(ctx.get(), req);
    while (reader->Read(&op)) PrintOperation(c, op);
    s = reader->Finish();
    if (!s.ok()) return ReportRpcError("operations watch", s);
    return ExitForOperation(op);
  } else {
    return Usage(absl::StrCat("unknown operations verb '", verb, "'"));
  }
  if (!s.ok()) return ReportRpcError(absl::StrCat("operations ", verb), s);
  PrintOperation(c, op);
  return verb == "wait" ? ExitForOperation(op) : kExitOk;
}

}  // namespace
}  // namespace memprofd::cli

int main(int argc, char** argv) {
  using namespace memprofd::cli;
  absl::SetProgramUsageMessage("memprofctl: the command-line client of memprofd");
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) return Usage("no command given");
  const std::string command = positional[1];
  Args args(positional.begin() + 2, positional.end());

  static const std::map<std::string, std::function<int(const Context&, const Args&)>>
      kCommands = {{"status", Status}, {"health", Health}, {"operations", Operations}};
  auto it = kCommands.find(command);
  if (it == kCommands.end())
    return Usage(absl::StrCat("unknown command '", command, "'"));

  memprofd::ClientOptions options;
  options.addr = absl::GetFlag(FLAGS_addr);
  options.token_file = absl::GetFlag(FLAGS_token_file);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  auto client = memprofd::Client::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "memprofctl: %s\n",
                 std::string(client.status().message()).c_str());
    return kExitUsage;
  }
  Context c{client->get(), absl::GetFlag(FLAGS_json),
            std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms))};
  return it->second(c, args);
}

#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <torch/version.h>

#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/log.h"
#include "core/common/status_macros.h"
#include "server/session_metrics.h"

namespace memprofd {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read --", flag, "='", path, "'"));
  }
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool IsLoopback(const std::string& address) {
  return absl::StartsWith(address, "127.") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]:");
}

}  // namespace

Server::Server(ServerOptions options, Runtime& runtime)
    : options_(std::move(options)), runtime_(runtime) {}

Server::~Server() {
  // A shutdown the run's end started finishes first.
  std::thread stopper;
  {
    absl::MutexLock lock(&mu_);
    stopper.swap(stopper_);
  }
  if (stopper.joinable()) stopper.join();
  Shutdown();
}

int Server::exit_code() {
  absl::MutexLock lock(&mu_);
  return exit_code_;
}

void Server::OnRunEnded(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    exit_code_ = 1;
    if (server_) server_->GetHealthCheckService()->SetServingStatus(false);
  }
  if (shut_down_ || stopper_.joinable()) return;
  stopper_ = std::thread([this] { Shutdown(); });
}

absl::Status Server::Start() {
  RETURN_IF_ERROR(ValidateListenAddress("listen", options_.listen));
  RETURN_IF_ERROR(ValidateListenAddress("metrics_listen", options_.metrics_listen));
  if (options_.tls_cert.empty() != options_.tls_key.empty()) {
    return absl::InvalidArgumentError("give both --tls_cert and --tls_key, or neither");
  }
  ASSIGN_OR_RETURN(auth_, TokenAuth::Create(options_.auth_token_file));
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options_.tls_cert.empty()) {
    ASSIGN_OR_RETURN(std::string cert, ReadFile("tls_cert", options_.tls_cert));
    ASSIGN_OR_RETURN(std::string key, ReadFile("tls_key", options_.tls_key));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(ssl);
  }
  if (!auth_->enabled() && !IsLoopback(options_.listen)) {
    LogWarning(absl::StrCat("listening on ", options_.listen,
                            " beyond loopback without --auth_token_file: anyone who can "
                            "reach it can train, snapshot and read memory"));
  }

  if (options_.snapshot_on_shutdown && options_.session.snapshot_root.empty()) {
    return absl::InvalidArgumentError("--snapshot_on_shutdown needs --snapshot_root");
  }
  ASSIGN_OR_RETURN(session_, Session::Create(options_.session, runtime_));

  metrics_ = std::make_unique<ServerMetrics>(
      BuildLabels{MEMPROFD_VERSION, TORCH_VERSION, session_->device()},
      options_.session.world);
  metrics_->AddCollectable(SessionMetrics::Attach(session_.get()));
  ASSIGN_OR_RETURN(metrics_port_, metrics_->Serve(options_.metrics_listen));

  ServiceInfo info;
  info.version = MEMPROFD_VERSION;
  info.torch_version = TORCH_VERSION;
  info.grpc_version = grpc::Version();
  info.build_type = MEMPROFD_BUILD_TYPE;
#ifdef MEMPROFD_WITH_CUDA
  info.cuda_compiled = true;
#endif
  service_ = std::make_unique<MemprofdService>(session_.get(), auth_.get(),
                                               metrics_.get(), info);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, creds, &grpc_port_);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || grpc_port_ == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on --listen=", options_.listen,
        " (is the port in use, or the address not on this host? pick another or use "
        "port 0)"));
  }
  server_->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  RETURN_IF_ERROR(WritePortFile());
  session_->SetFatalHandler([this](const absl::Status& status) { OnRunEnded(status); });
  LogInfo(absl::StrCat(
      "serving gRPC on port ", grpc_port_, " (", options_.listen, "), metrics on http://",
      options_.metrics_listen.substr(0, options_.metrics_listen.rfind(':')), ":",
      metrics_port_, "/metrics, device ", session_->device()));
  return absl::OkStatus();
}

absl::Status Server::WritePortFile() const {
  if (options_.port_file.empty()) return absl::OkStatus();
  const std::string tmp = options_.port_file + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "{\"grpc_port\": " << grpc_port_ << ", \"metrics_port\": " << metrics_port_
        << "}\n";
    if (!out) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot write --port_file='", options_.port_file, "'"));
    }
  }
  if (std::rename(tmp.c_str(), options_.port_file.c_str()) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot rename the port file into '", options_.port_file, "'"));
  }
  return absl::OkStatus();
}

void Server::Wait() {
  if (server_) server_->Wait();
}

void Server::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (server_) {
    server_->GetHealthCheckService()->SetServingStatus(false);
  }
  if (session_) {
    // From here status says DRAINING and new operations are UNAVAILABLE; the
    // shutdown snapshot is written at the boundary the training stops at. A
    // broken data-parallel run has no consistent state to save; a follower
    // leaves the run's snapshot to rank 0.
    const bool snapshot = options_.snapshot_on_shutdown && !session_->follower() &&
                          !session_->fatal_status();
    const std::string name =
        snapshot ? absl::StrCat("shutdown-", absl::ToUnixSeconds(absl::Now())) : "";
    const absl::Status s = session_->BeginDrain(name);
    if (snapshot && s.ok()) {
      LogInfo(absl::StrCat("snapshot '", name, "' taken before shutdown"));
    } else if (snapshot) {
      LogError(absl::StrCat("snapshot on shutdown failed: ", s.message()));
    }
    session_->Shutdown();
  }
  if (server_) {
    server_->Shutdown(
        absl::ToChronoTime(absl::Now() + absl::Seconds(options_.shutdown_grace_seconds)));
  }
}

}  // namespace memprofd

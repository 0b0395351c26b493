#include "client/client.h"

#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace memprofd {
namespace {

absl::StatusOr<std::string> ReadAll(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", what, " '", path, "'"));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  std::string token;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> text = ReadAll("--token_file", options.token_file);
    if (!text.ok()) return text.status();
    token = std::string(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
    if (token.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--token_file '", options.token_file, "' holds no token"));
    }
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadAll("--tls_ca", options.tls_ca_file);
    if (!ca.ok()) return ca.status();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *ca;
    creds = grpc::SslCredentials(ssl);
  }
  return std::unique_ptr<Client>(
      new Client(grpc::CreateChannel(options.addr, creds), std::move(token)));
}

Client::Client(std::shared_ptr<grpc::Channel> channel, std::string token)
    : channel_(std::move(channel)),
      stub_(v1::Memprofd::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)),
      token_(std::move(token)) {}

std::unique_ptr<grpc::ClientContext> Client::NewContext(
    std::chrono::milliseconds timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  if (timeout.count() > 0) ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  return ctx;
}

}  // namespace memprofd

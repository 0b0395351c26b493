#include "server/auth.h"

#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace memprofd {
namespace {

// Compares without an early exit so that timing does not leak the token.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || b.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::Create(
    const std::string& token_file) {
  if (token_file.empty()) return std::unique_ptr<TokenAuth>(new TokenAuth(""));
  std::ifstream in(token_file);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read --auth_token_file '", token_file,
                     "': check that it exists and that the daemon's user may read it"));
  }
  std::string line;
  std::getline(in, line);
  std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--auth_token_file '", token_file, "' holds no token on its first line"));
  }
  return std::unique_ptr<TokenAuth>(new TokenAuth(std::move(token)));
}

absl::Status TokenAuth::Check(const grpc::ServerContextBase& context) const {
  if (!enabled()) return absl::OkStatus();
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        "missing 'authorization: Bearer <token>' metadata; this memprofd was started "
        "with --auth_token_file");
  }
  std::string value(it->second.data(), it->second.size());
  constexpr char kPrefix[] = "Bearer ";
  if (value.rfind(kPrefix, 0) != 0 ||
      !ConstantTimeEquals(value.substr(sizeof(kPrefix) - 1), token_)) {
    return absl::UnauthenticatedError("the bearer token in 'authorization' is wrong");
  }
  return absl::OkStatus();
}

}  // namespace memprofd

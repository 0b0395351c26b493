#include "server/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace memprofd {
namespace {

// Compares a presented token with the secret in time that depends only on
// the secret's length: no early exit at the first differing byte, and none
// for a presented token of another length (its bytes past the secret's end
// are never read, so a long guess costs what a short one does). The
// accumulator is volatile so that the compiler cannot turn the loop into a
// memcmp that stops early.
bool ConstantTimeEquals(absl::string_view presented, absl::string_view secret) {
  volatile unsigned char diff = presented.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < secret.size(); ++i) {
    const unsigned char p =
        i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff = diff | (p ^ static_cast<unsigned char>(secret[i]));
  }
  return diff == 0 && !secret.empty();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenAuth>> TokenAuth::Create(
    const std::string& token_file) {
  if (token_file.empty()) return std::unique_ptr<TokenAuth>(new TokenAuth(""));
  // One descriptor for the mode check and the read, so that the file checked
  // is the file read.
  const int fd = ::open(token_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot read --auth_token_file '", token_file, "' (", std::strerror(errno),
        "): check that it exists and that the daemon's user may read it"));
  }
  struct stat st;
  std::string text;
  bool read_ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  char buf[4096];
  while (read_ok && text.size() < (1 << 20)) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      read_ok = n == 0;
      break;
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (!read_ok) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot read --auth_token_file '", token_file, "': it must be a regular file"));
  }
  const absl::string_view first_line = absl::string_view(text).substr(0, text.find('\n'));
  std::string token(absl::StripAsciiWhitespace(first_line));
  if (token.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--auth_token_file '", token_file, "' holds no token on its first line"));
  }
  // Refused, not warned about, as ssh refuses a private key others can read:
  // whoever reads the token controls the daemon (training, snapshots,
  // deletes), and a warning in a service log is easily missed. Group read
  // stays allowed for Kubernetes secrets mounted with an fsGroup (0440).
  if ((st.st_mode & (S_IRWXO | S_IWGRP)) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--auth_token_file '", token_file, "' has mode ",
        absl::StrFormat("%04o", st.st_mode & 07777),
        ": other users can read or change the token; run chmod 600 on it (or 0400, "
        "as deploy/kubernetes mounts it)"));
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
  const absl::string_view value(it->second.data(), it->second.size());
  // The scheme is case-insensitive (RFC 7235 section 2.1, as RFC 6750 uses it).
  constexpr absl::string_view kScheme = "bearer ";
  if (!absl::StartsWithIgnoreCase(value, kScheme) ||
      !ConstantTimeEquals(value.substr(kScheme.size()), token_)) {
    return absl::UnauthenticatedError("the bearer token in 'authorization' is wrong");
  }
  return absl::OkStatus();
}

}  // namespace memprofd

#include "tests/server/scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace testing {

absl::StatusOr<std::string> ScrapeMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("nothing answers on port ", port));
  }
  // HTTP/1.0: the server closes the connection after the body.
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("cannot send the request");
  }
  std::string response;
  char buffer[8192];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  close(fd);
  if (!absl::StartsWith(response, "HTTP/1.1 200") &&
      !absl::StartsWith(response, "HTTP/1.0 200")) {
    return absl::InternalError(absl::StrCat("not 200 OK: ", response.substr(0, 200)));
  }
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return absl::InternalError("no end of headers");
  return response.substr(body + 4);
}

std::vector<std::string> SamplesWithoutLabels(const std::string& text,
                                              const std::vector<std::string>& labels) {
  std::vector<std::string> missing;
  int samples = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "#")) continue;
    ++samples;
    const size_t open = line.find('{');
    const size_t close = line.find('}');
    const absl::string_view set = open == absl::string_view::npos || close < open
                                      ? absl::string_view()
                                      : line.substr(open, close - open + 1);
    for (const std::string& label : labels) {
      if (!absl::StrContains(set, "{" + label) && !absl::StrContains(set, "," + label)) {
        missing.emplace_back(line);
        break;
      }
    }
  }
  EXPECT_GT(samples, 0) << "no samples in:\n" << text;
  return missing;
}

}  // namespace testing
}  // namespace memprofd

#include "tests/memory/test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/memory/install.h"

namespace memprofd {
namespace memory {

void EnsureAccountingInstalled() {
  const absl::Status status = InstallMemoryAccounting();
  ASSERT_TRUE(status.ok()) << status;
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/memprofd_memory_test_", getpid(),
                      "_", name);
}

int RunCommand(const std::string& command, std::string* output) {
  output->clear();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output->append(buf.data(), n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace memory
}  // namespace memprofd

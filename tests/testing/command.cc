#include "tests/testing/command.h"

#include <stdio.h>
#include <sys/wait.h>

#include <array>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace memprofd {
namespace testing {

int RunCommand(const std::string& command, std::string* output) {
  output->clear();
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) output->append(buf.data(), n);
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int RunPython(const std::vector<std::string>& args, std::string* output) {
  std::string command = MEMPROFD_PYTHON;
  // Single quotes keep everything literal; a single quote itself is closed,
  // escaped and reopened.
  for (const std::string& arg : args) {
    absl::StrAppend(&command, " '", absl::StrReplaceAll(arg, {{"'", "'\\''"}}), "'");
  }
  return RunCommand(command, output);
}

std::string SourcePath(absl::string_view relative) {
  return absl::StrCat(MEMPROFD_SOURCE_DIR, "/", relative);
}

}  // namespace testing
}  // namespace memprofd

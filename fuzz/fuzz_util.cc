#include "fuzz/fuzz_util.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace memprofd {
namespace fuzz {

void CheckBadInputStatus(const absl::Status& status,
                         std::initializer_list<absl::StatusCode> allowed) {
  if (status.ok()) return;
  bool found = false;
  for (absl::StatusCode code : allowed) found = found || status.code() == code;
  if (!found || status.message().empty()) {
    std::fprintf(stderr, "unexpected status for bad input: %s\n",
                 status.ToString().c_str());
    std::abort();
  }
}

namespace {

struct Scratch {
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                          "/memprofd-fuzz-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    FUZZ_CHECK(mkdtemp(buf.data()) != nullptr);
    dir = buf.data();
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string dir;
};

}  // namespace

const std::string& ScratchDir() {
  static Scratch* scratch = [] {
    static Scratch s;
    return &s;
  }();
  return scratch->dir;
}

void WriteFileOrDie(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  FUZZ_CHECK(out.good());
}

void ClearDir(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::filesystem::remove_all(entry.path(), ec);
  }
}

std::vector<absl::string_view> SplitInput(absl::string_view data,
                                          absl::string_view separator, size_t max_parts) {
  std::vector<absl::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = data.find(separator);
    if (at == absl::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + separator.size());
  }
  parts.push_back(data);
  return parts;
}

}  // namespace fuzz
}  // namespace memprofd

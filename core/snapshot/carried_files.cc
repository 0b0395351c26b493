#include "core/snapshot/carried_files.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/algorithm/container.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/common/files.h"

namespace memprofd {
namespace snapshot {

const std::vector<std::string>& CarriedFileNames() {
  static const std::vector<std::string> names = {
      "generation_config.json",
      "tokenizer.json",
      "tokenizer_config.json",
      "special_tokens_map.json",
      "added_tokens.json",
      "chat_template.jinja",
      "chat_template.json",
      "tokenizer.model",
      "vocab.json",
      "merges.txt",
      "vocab.txt",
  };
  return names;
}

bool IsCarriedFileName(absl::string_view name) {
  return absl::c_find(CarriedFileNames(), name) != CarriedFileNames().end();
}

absl::StatusOr<CarriedFiles> ReadCarriedFiles(const std::string& dir,
                                              const PathRoots* roots) {
  CarriedFiles out;
  int64_t total = 0;
  for (const std::string& name : CarriedFileNames()) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;  // not there: nothing to carry
    absl::StatusOr<std::string> bytes =
        ReadSmallRegularFile(path, kMaxCarriedFileBytes, name, roots);
    if (absl::IsPermissionDenied(bytes.status())) return bytes.status();
    if (!bytes.ok()) {
      out.skipped.push_back(absl::StrCat(name, ": ", bytes.status().message()));
      continue;
    }
    if (total + static_cast<int64_t>(bytes->size()) > kMaxCarriedBytes) {
      out.skipped.push_back(absl::StrCat(name, ": the carried files would pass ",
                                         kMaxCarriedBytes, " bytes in all"));
      continue;
    }
    total += static_cast<int64_t>(bytes->size());
    out.files.push_back({name, *std::move(bytes)});
  }
  return out;
}

}  // namespace snapshot
}  // namespace memprofd

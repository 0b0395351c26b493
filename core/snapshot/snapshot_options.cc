#include "core/snapshot/snapshot_options.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace memprofd {
namespace snapshot {

absl::string_view SnapshotDtypeName(SnapshotDtype dtype) {
  switch (dtype) {
    case SnapshotDtype::kKeep:
      return "keep";
    case SnapshotDtype::kBFloat16:
      return "bf16";
    case SnapshotDtype::kFloat16:
      return "fp16";
    case SnapshotDtype::kFloat32:
      return "fp32";
  }
  return "keep";
}

absl::StatusOr<SnapshotDtype> ParseSnapshotDtype(absl::string_view text) {
  const std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (s == "keep" || s.empty()) return SnapshotDtype::kKeep;
  if (s == "bf16" || s == "bfloat16") return SnapshotDtype::kBFloat16;
  if (s == "fp16" || s == "float16") return SnapshotDtype::kFloat16;
  if (s == "fp32" || s == "float32") return SnapshotDtype::kFloat32;
  return absl::InvalidArgumentError(absl::StrCat("unknown snapshot dtype \"", text,
                                                 "\"; use keep, bf16, fp16 or fp32"));
}

}  // namespace snapshot
}  // namespace memprofd

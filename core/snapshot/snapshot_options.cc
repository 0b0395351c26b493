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

absl::string_view SnapshotKindName(SnapshotKind kind) {
  switch (kind) {
    case SnapshotKind::kCheckpoint:
      return "checkpoint";
    case SnapshotKind::kAdapter:
      return "adapter";
    case SnapshotKind::kMerged:
      return "merged";
    case SnapshotKind::kWeights:
      break;
  }
  return "weights";
}

absl::StatusOr<SnapshotKind> ParseSnapshotKind(absl::string_view text) {
  const std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (s == "weights") return SnapshotKind::kWeights;
  if (s == "checkpoint") return SnapshotKind::kCheckpoint;
  if (s == "adapter") return SnapshotKind::kAdapter;
  if (s == "merged") return SnapshotKind::kMerged;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown snapshot kind \"", text,
                   "\"; use weights, checkpoint, adapter or merged"));
}

absl::Status CheckCheckpointDtype(const SnapshotOptions& options) {
  if (options.kind != SnapshotKind::kCheckpoint ||
      options.dtype == SnapshotDtype::kKeep || options.dtype == SnapshotDtype::kFloat32) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("a checkpoint keeps the float32 weights as they are so that training "
                   "resumes exactly; dtype ",
                   SnapshotDtypeName(options.dtype),
                   " would convert them: use dtype keep, or take a weights snapshot"));
}

}  // namespace snapshot
}  // namespace memprofd

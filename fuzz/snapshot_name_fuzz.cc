// Snapshot names from requests: ValidateSnapshotName, then DescribeSnapshot
// and DeleteSnapshot with that name in a scratch root that holds one real
// snapshot directory ("keep") and sits beside a file outside it. Oracle: a
// name accepted names a direct child of the root (no separator, "..", or
// leading '.'); INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION /
// DATA_LOSS only; nothing outside the root is ever removed, and "keep" is
// removed only when the name is "keep".

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "core/snapshot/snapshot_store.h"
#include "fuzz/fuzz_util.h"

using memprofd::fuzz::CheckBadInputStatus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  const std::string name(reinterpret_cast<const char*>(data), size);
  const absl::Status valid = memprofd::snapshot::ValidateSnapshotName(name);
  if (!valid.ok()) {
    CheckBadInputStatus(valid, {absl::StatusCode::kInvalidArgument});
    return 0;
  }
  FUZZ_CHECK(!name.empty() && name[0] != '.');
  FUZZ_CHECK(name.find('/') == std::string::npos && name.find('\0') == std::string::npos);
  const fs::path root = fs::path(memprofd::fuzz::ScratchDir()) / "root";
  const fs::path joined = (root / name).lexically_normal();
  FUZZ_CHECK(joined.parent_path() == root.lexically_normal());
  FUZZ_CHECK(joined.filename() == name);

  const fs::path outside = fs::path(memprofd::fuzz::ScratchDir()) / "outside";
  fs::create_directories(root / "keep");
  memprofd::fuzz::WriteFileOrDie(outside.string(), "x");
  auto described = memprofd::snapshot::DescribeSnapshot(root.string(), name);
  if (!described.ok()) {
    CheckBadInputStatus(described.status(), {absl::StatusCode::kNotFound,
                                             absl::StatusCode::kFailedPrecondition,
                                             absl::StatusCode::kDataLoss});
  }
  const absl::Status deleted = memprofd::snapshot::DeleteSnapshot(root.string(), name);
  if (!deleted.ok()) CheckBadInputStatus(deleted, {absl::StatusCode::kNotFound});
  FUZZ_CHECK(fs::exists(outside));
  FUZZ_CHECK(fs::exists(root / "keep") || name == "keep");
  return 0;
}

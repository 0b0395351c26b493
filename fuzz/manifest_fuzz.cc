// ManifestFromJson on arbitrary text (memprofd_manifest.json files are read
// back from disk by ListSnapshots). Oracle: DATA_LOSS only for bad input; an
// accepted manifest written again with ManifestToJson reads back equal.

#include <cstddef>
#include <cstdint>

#include "core/snapshot/manifest.h"
#include "fuzz/fuzz_util.h"

using memprofd::snapshot::ManifestFromJson;
using memprofd::snapshot::ManifestToJson;
using memprofd::snapshot::SnapshotManifest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<SnapshotManifest> m =
      ManifestFromJson(text, "fuzz/memprofd_manifest.json");
  if (!m.ok()) {
    memprofd::fuzz::CheckBadInputStatus(m.status(), {absl::StatusCode::kDataLoss});
    return 0;
  }
  const std::string again = ManifestToJson(*m);
  absl::StatusOr<SnapshotManifest> back = ManifestFromJson(again, "again");
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(ManifestToJson(*back) == again);
  FUZZ_CHECK(back->name == m->name && back->files.size() == m->files.size() &&
             back->create_time == m->create_time && back->total_size == m->total_size);
  return 0;
}

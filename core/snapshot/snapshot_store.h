#ifndef MEMPROFD_CORE_SNAPSHOT_SNAPSHOT_STORE_H_
#define MEMPROFD_CORE_SNAPSHOT_SNAPSHOT_STORE_H_

// The snapshot root: one directory per published snapshot, `<root>/<name>`,
// each holding memprofd_manifest.json; snapshots being written or deleted
// live in hidden `<root>/.tmp-*` directories and are never visible under
// their name until complete. No LibTorch. The functions are safe to call
// from any thread, but the daemon serializes them with the writer on its
// owner thread (two writers racing on one name: one gets ALREADY_EXISTS).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/snapshot/manifest.h"

namespace memprofd {
namespace snapshot {

// Prefix of temporary directories inside the root.
inline constexpr char kTempPrefix[] = ".tmp-";

// OK when `name` can name a snapshot: 1 to 200 bytes of ASCII letters,
// digits, '-', '_' and '.', not starting with '.' (hidden names are the
// writer's) or '-' (an option to a shell), without "..". Nothing else: no
// spaces, '*', '~', or non-ASCII (bidirectional controls, look-alikes).
// INVALID_ARGUMENT saying what is wrong otherwise (the name cut to 64 bytes).
absl::Status ValidateSnapshotName(absl::string_view name);

// OK unless `root` is a symbolic link owned by a user other than this
// process's and root (a link someone else planted, e.g. in /tmp, could send
// every write and delete elsewhere): FAILED_PRECONDITION then. OK when `root`
// does not exist. Call before creating or using the root.
absl::Status CheckSnapshotRoot(const std::string& root);

// Removes `<root>/.tmp-*` left by snapshots that were killed or failed.
// Call once at daemon start, before any writer runs (it would remove a
// running writer's directory). Returns how many were removed; OK when the
// root does not exist.
absl::StatusOr<int> CleanLeftovers(const std::string& root);

// Every published snapshot (directories with a readable manifest), oldest
// first (create time, then name). Directories without a manifest, hidden
// entries and damaged manifests are skipped. Empty when the root does not
// exist; FAILED_PRECONDITION when it is not a directory.
absl::StatusOr<std::vector<SnapshotManifest>> ListSnapshots(const std::string& root);

// The newest checkpoint in ListSnapshots' order (what a daemon started with
// --resume=latest loads), or nullopt when the root holds none. A snapshot
// killed while being written was never published, so the one returned is
// complete. ListSnapshots' errors.
absl::StatusOr<std::optional<SnapshotManifest>> LatestCheckpoint(const std::string& root);

// The manifest of `name`. INVALID_ARGUMENT for a bad name, NOT_FOUND when
// there is no such snapshot, FAILED_PRECONDITION when the directory is not
// a memprofd snapshot (no manifest) or is a symbolic link (never followed),
// DATA_LOSS when the manifest is damaged.
absl::StatusOr<SnapshotManifest> DescribeSnapshot(const std::string& root,
                                                  absl::string_view name);

// Deletes snapshot `name`: renames it to a hidden temporary directory first
// (so it disappears at once, never half-deleted), then removes that.
// INVALID_ARGUMENT for a bad name, NOT_FOUND when missing,
// FAILED_PRECONDITION when `<root>/<name>` is a symbolic link (left alone).
absl::Status DeleteSnapshot(const std::string& root, absl::string_view name);

// Deletes all but the newest `keep_last` snapshots (by create time);
// keep_last == 0 keeps everything. Returns the deleted names, oldest first.
// INVALID_ARGUMENT for keep_last < 0.
absl::StatusOr<std::vector<std::string>> ApplyRetention(const std::string& root,
                                                        int keep_last);

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_SNAPSHOT_STORE_H_

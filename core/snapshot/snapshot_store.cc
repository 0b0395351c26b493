#include "core/snapshot/snapshot_store.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/snapshot/internal/file_io.h"

namespace memprofd {
namespace snapshot {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxNameBytes = 200;

absl::Status BadName(absl::string_view name, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid snapshot name \"", absl::CEscape(name.substr(0, 64)),
      name.size() > 64 ? "..." : "", "\": ", why,
      "; use ASCII letters, digits, '-', '_' and '.', not starting with '.' or '-', "
      "at most 200 bytes"));
}

// Snapshots are directories the writer made by rename; a symbolic link under
// a snapshot's name was put there by someone else, and following it would
// read (Describe, Load) or delete (Delete, retention) outside the root.
absl::Status RefuseSymlink(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(dir, ec))) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir.string(),
        " is a symbolic link, not a snapshot memprofd wrote; memprofd never follows "
        "it: remove the link"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSnapshotName(absl::string_view name) {
  if (name.empty()) return BadName(name, "it is empty");
  if (name.size() > kMaxNameBytes) return BadName(name, "it is longer than 200 bytes");
  const unsigned char first = static_cast<unsigned char>(name[0]);
  if (first == '.')
    return BadName(name, "it starts with '.' (hidden names are reserved)");
  if (first == '-')
    return BadName(name, "it starts with '-' (a shell would read it as an option)");
  if (absl::StrContains(name, "..")) return BadName(name, "it contains \"..\"");
  for (const char ch : name) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '/' || c == '\\') return BadName(name, "it contains a path separator");
    if (c < 0x20 || c == 0x7F) return BadName(name, "it contains a control character");
    if (c >= 0x80) {
      return BadName(name,
                     "it contains a byte outside ASCII (non-ASCII names can hide "
                     "bidirectional controls and look-alike characters)");
    }
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.') {
      return BadName(name, absl::StrCat("it contains '", std::string(1, ch), "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSnapshotRoot(const std::string& root) {
  struct stat st;
  if (::lstat(root.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return absl::OkStatus();
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "snapshot root ", root, " is a symbolic link owned by uid ", st.st_uid,
        ", neither this process's user nor root: someone else could point it anywhere. "
        "Give the real directory, or replace the link with one of your own"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CleanLeftovers(const std::string& root) {
  std::error_code ec;
  if (!fs::exists(root, ec)) return 0;
  int removed = 0;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::StartsWith(name, kTempPrefix)) continue;
    std::error_code rm_ec;
    fs::remove_all(it->path(), rm_ec);
    if (rm_ec) {
      return snapshot::internal::ErrnoStatus(
          rm_ec.value(), absl::StrCat("removing leftover ", it->path().string()));
    }
    ++removed;
  }
  if (ec) {
    return snapshot::internal::ErrnoStatus(ec.value(),
                                           absl::StrCat("listing snapshot root ", root));
  }
  return removed;
}

absl::StatusOr<std::optional<SnapshotManifest>> LatestCheckpoint(
    const std::string& root) {
  ASSIGN_OR_RETURN(std::vector<SnapshotManifest> all, ListSnapshots(root));
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->is_checkpoint()) return *std::move(it);
  }
  return std::nullopt;
}

absl::StatusOr<SnapshotManifest> DescribeSnapshot(const std::string& root,
                                                  absl::string_view name) {
  RETURN_IF_ERROR(ValidateSnapshotName(name));
  const fs::path dir = fs::path(root) / std::string(name);
  RETURN_IF_ERROR(RefuseSymlink(dir));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("no snapshot \"", name, "\" under ", root,
                                            "; ListSnapshots shows them"));
  }
  const std::string path = (dir / kManifestFileName).string();
  absl::StatusOr<std::string> text = snapshot::internal::ReadSmallFile(path);
  if (absl::IsNotFound(text.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir.string(), " is not a memprofd snapshot (no ", kManifestFileName, ")"));
  }
  if (!text.ok()) return text.status();
  ASSIGN_OR_RETURN(SnapshotManifest m, ManifestFromJson(*text, path));
  m.name = std::string(name);
  m.directory = fs::absolute(dir).lexically_normal().string();
  return m;
}

absl::StatusOr<std::vector<SnapshotManifest>> ListSnapshots(const std::string& root) {
  std::vector<SnapshotManifest> out;
  std::error_code ec;
  if (!fs::exists(root, ec)) return out;
  if (!fs::is_directory(root, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot root ", root, " is not a directory"));
  }
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!ValidateSnapshotName(name).ok()) continue;
    absl::StatusOr<SnapshotManifest> m = DescribeSnapshot(root, name);
    if (m.ok()) out.push_back(*std::move(m));
  }
  if (ec) {
    return snapshot::internal::ErrnoStatus(ec.value(),
                                           absl::StrCat("listing snapshot root ", root));
  }
  std::sort(out.begin(), out.end(),
            [](const SnapshotManifest& a, const SnapshotManifest& b) {
              if (a.create_time != b.create_time) return a.create_time < b.create_time;
              return a.name < b.name;
            });
  return out;
}

absl::Status DeleteSnapshot(const std::string& root, absl::string_view name) {
  RETURN_IF_ERROR(ValidateSnapshotName(name));
  const fs::path dir = fs::path(root) / std::string(name);
  RETURN_IF_ERROR(RefuseSymlink(dir));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("no snapshot \"", name, "\" under ", root));
  }
  std::string tmpl =
      (fs::path(root) / absl::StrCat(kTempPrefix, "del-", name, "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return snapshot::internal::ErrnoStatus(
        errno, absl::StrCat("deleting snapshot ", dir.string()));
  }
  // rename() replaces the empty directory mkdtemp made.
  if (::rename(dir.c_str(), tmpl.c_str()) != 0) {
    const int err = errno;
    ::rmdir(tmpl.c_str());
    return snapshot::internal::ErrnoStatus(
        err, absl::StrCat("deleting snapshot ", dir.string()));
  }
  RETURN_IF_ERROR(snapshot::internal::SyncDirectory(root));
  fs::remove_all(tmpl, ec);
  if (ec) {
    return snapshot::internal::ErrnoStatus(
        ec.value(), absl::StrCat("removing ", tmpl, " (snapshot ", name,
                                 " is gone; CleanLeftovers removes the rest)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ApplyRetention(const std::string& root,
                                                        int keep_last) {
  if (keep_last < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep_last must be >= 0 (0 keeps every snapshot), got ", keep_last));
  }
  std::vector<std::string> deleted;
  if (keep_last == 0) return deleted;
  ASSIGN_OR_RETURN(std::vector<SnapshotManifest> all, ListSnapshots(root));
  const size_t keep = static_cast<size_t>(keep_last);
  for (size_t i = 0; i + keep < all.size(); ++i) {
    RETURN_IF_ERROR(DeleteSnapshot(root, all[i].name));
    deleted.push_back(all[i].name);
  }
  return deleted;
}

}  // namespace snapshot
}  // namespace memprofd

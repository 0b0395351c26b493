// Client-named paths against a root with hostile links in it: PathRoots and
// ReadOnlyFile (core/common/files.h). Whatever the path, nothing outside the
// root is ever opened: a path Confine accepts resolves inside the root, and
// a file ReadOnlyFile::Open opens under the roots is one of the root's own.

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "core/common/files.h"
#include "fuzz/fuzz_util.h"

namespace {

namespace fs = std::filesystem;

constexpr char kInside[] = "inside-bytes";
constexpr char kSecret[] = "SECRET";

// scratch/root: a file, a subdirectory, and links that lead up, out, to
// /etc, to themselves and to a FIFO; scratch/outside holds the secret.
struct Tree {
  std::string root;
  std::string outside;
  memprofd::PathRoots roots;
  Tree() {
    const std::string base = memprofd::fuzz::ScratchDir();
    root = base + "/root";
    outside = base + "/outside";
    fs::create_directories(root + "/sub");
    fs::create_directories(outside);
    memprofd::fuzz::WriteFileOrDie(root + "/a.txt", kInside);
    memprofd::fuzz::WriteFileOrDie(root + "/sub/b.txt", kInside);
    memprofd::fuzz::WriteFileOrDie(outside + "/secret.txt", kSecret);
    std::error_code ec;
    fs::create_symlink("..", root + "/up", ec);
    fs::create_symlink("../outside", root + "/out", ec);
    fs::create_symlink(outside + "/secret.txt", root + "/secret.txt", ec);
    fs::create_symlink("/etc", root + "/etc", ec);
    fs::create_symlink("loop", root + "/loop", ec);
    fs::create_symlink("sub/b.txt", root + "/b-link.txt", ec);
    ::mkfifo((root + "/fifo").c_str(), 0600);
    fs::create_symlink("fifo", root + "/fifo-link", ec);
    absl::StatusOr<memprofd::PathRoots> made =
        memprofd::PathRoots::Create({root}, "data_roots");
    FUZZ_CHECK(made.ok());
    roots = *std::move(made);
    root = roots.roots().front();  // canonical
  }
};

const Tree& GetTree() {
  static const Tree* tree = new Tree();
  return *tree;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tree& tree = GetTree();
  std::string path(reinterpret_cast<const char*>(data), size);
  // Mostly relative to the root (where the links are); '/'-led as given.
  const bool under_root = path.empty() || path[0] != '/';
  if (under_root) path = tree.root + "/" + path;
  if (path.size() > 4096) return 0;

  absl::StatusOr<std::string> confined = tree.roots.Confine(path, "data file");
  if (!confined.ok()) {
    memprofd::fuzz::CheckBadInputStatus(
        confined.status(),
        {absl::StatusCode::kInvalidArgument, absl::StatusCode::kPermissionDenied,
         absl::StatusCode::kNotFound});
    // The path is echoed; the file's contents never are.
    FUZZ_CHECK(absl::StrContains(path, kSecret) ||
               !absl::StrContains(confined.status().message(), kSecret));
  } else {
    FUZZ_CHECK(tree.roots.Contains(*confined));
    FUZZ_CHECK(!absl::StartsWith(*confined, fs::canonical(tree.outside).string()));
  }
  // Opened under the roots, as the daemon opens a confined path (and as a
  // raw one that a rename could swap): only the root's own bytes come back.
  // An absolute input is only ever confined, never opened raw: it could
  // name a device whose open has effects.
  for (const std::string& candidate :
       {confined.ok() ? *confined : std::string(), under_root ? path : std::string()}) {
    if (candidate.empty() || candidate.find('\0') != std::string::npos) continue;
    absl::StatusOr<std::unique_ptr<memprofd::ReadOnlyFile>> file =
        memprofd::ReadOnlyFile::Open(candidate, 1 << 20, "data file", &tree.roots);
    if (!file.ok()) {
      FUZZ_CHECK(absl::StrContains(candidate, kSecret) ||
                 !absl::StrContains(file.status().message(), kSecret));
      continue;
    }
    std::string bytes(static_cast<size_t>((*file)->size()), '\0');
    FUZZ_CHECK((*file)->ReadAt(0, (*file)->size(), bytes.data()).ok());
    FUZZ_CHECK(bytes == kInside);
  }
  return 0;
}

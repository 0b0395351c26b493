#include "core/snapshot/loader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/json.h"
#include "core/common/status_macros.h"
#include "core/snapshot/internal/file_io.h"
#include "core/snapshot/manifest.h"
#include "core/snapshot/shard_plan.h"

namespace memprofd {
namespace snapshot {
namespace {

namespace fs = std::filesystem;

// True when `path` names anything, a link included (followed or not, and
// wherever it leads: what it leads to is for the open to judge, inside the
// roots only).
bool Present(const fs::path& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

absl::Status AppendFile(const fs::path& path, const PathRoots* roots,
                        LoadedWeights* out) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                   SafetensorsFile::Open(path.string(), roots));
  ASSIGN_OR_RETURN(TensorList tensors, file->Tensors());
  for (auto& t : tensors) out->tensors.push_back(std::move(t));
  out->files.push_back(path.filename().string());
  return absl::OkStatus();
}

// weight_map of an index: name -> shard file.
absl::StatusOr<std::map<std::string, std::string>> ReadIndex(const fs::path& path,
                                                             const PathRoots* roots) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("damaged safetensors index ", path.string(),
                                            ": ", why, "; restore it or save again"));
  };
  ASSIGN_OR_RETURN(std::string text,
                   snapshot::internal::ReadSmallFile(path.string(), roots));
  absl::StatusOr<Json> json = ParseJson(text);
  if (!json.ok()) return bad(json.status().message());
  const Json* map = JsonFind(*json, "weight_map");
  if (map == nullptr || !map->is_object()) return bad("no weight_map object");
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string())
      return bad(absl::StrCat("weight_map[", name, "] is not a string"));
    const std::string& f = file.get_ref<const std::string&>();
    if (f.empty() || absl::StrContains(f, "/") || absl::StrContains(f, "\\") ||
        f == "." || f == "..") {
      return bad(
          absl::StrCat("shard name \"", f, "\" is not a file name in the directory"));
    }
    out[name] = f;
  }
  return out;
}

}  // namespace

absl::StatusOr<LoadedWeights> LoadSafetensorsDirectory(const std::string& dir,
                                                       const PathRoots* roots) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("model directory ", dir, " does not exist"));
  }
  LoadedWeights out;
  out.directory = dir;
  const fs::path root(dir);
  absl::StatusOr<std::string> config =
      snapshot::internal::ReadSmallFile((root / kConfigFileName).string(), roots);
  if (config.ok()) {
    out.config_json = *std::move(config);
  } else if (!absl::IsNotFound(config.status())) {
    return config.status();
  }

  // transformers resolves the single file before any index (a stale
  // model.safetensors wins over a newer sharded save).
  if (Present(root / kSingleFileName)) {
    RETURN_IF_ERROR(AppendFile(root / kSingleFileName, roots, &out));
    return out;
  }
  std::vector<fs::path> indexes;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (absl::EndsWith(it->path().filename().string(), ".safetensors.index.json")) {
      indexes.push_back(it->path());
    }
  }
  if (indexes.empty()) {
    // Weights without the file that says which tensor is where: loading
    // nothing (and initialising fresh weights) would be silently wrong.
    std::vector<std::string> shards;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      if (absl::EndsWith(it->path().filename().string(), ".safetensors")) {
        shards.push_back(it->path().filename().string());
      }
    }
    if (!shards.empty()) {
      std::sort(shards.begin(), shards.end());
      return absl::DataLossError(absl::StrCat(
          dir, " holds ", shards.size(), " safetensors file(s) (", shards.front(),
          shards.size() > 1 ? ", ..." : "", ") but neither ", kSingleFileName,
          " nor a *.safetensors.index.json naming them: the snapshot is incomplete; "
          "restore its index"));
    }
    return absl::NotFoundError(absl::StrCat("no ", kSingleFileName, " and no ",
                                            "*.safetensors.index.json in ", dir));
  }
  if (indexes.size() > 1) {
    std::vector<std::string> names;
    for (const auto& p : indexes) names.push_back(p.filename().string());
    std::sort(names.begin(), names.end());
    return absl::FailedPreconditionError(
        absl::StrCat("several safetensors indexes in ", dir, " (",
                     absl::StrJoin(names, ", "), "); keep exactly one"));
  }
  const fs::path& index_path = indexes[0];
  ASSIGN_OR_RETURN(auto weight_map, ReadIndex(index_path, roots));
  std::map<std::string, std::set<std::string>> by_shard;
  for (const auto& [name, file] : weight_map) by_shard[file].insert(name);
  std::set<std::string> loaded;
  for (const auto& [file, names] : by_shard) {
    const fs::path path = root / file;
    if (!Present(path)) {
      return absl::DataLossError(absl::StrCat("shard ", path.string(), " named by ",
                                              index_path.string(),
                                              " is missing; the snapshot is incomplete"));
    }
    const size_t before = out.tensors.size();
    RETURN_IF_ERROR(AppendFile(path, roots, &out));
    std::set<std::string> in_file;
    for (size_t i = before; i < out.tensors.size(); ++i) {
      const std::string& name = out.tensors[i].first;
      if (!loaded.insert(name).second) {
        return absl::DataLossError(absl::StrCat(
            "tensor ", name, " appears in two shards (", path.string(), " and another)"));
      }
      if (names.count(name) == 0) {
        return absl::DataLossError(absl::StrCat("tensor ", name, " in ", path.string(),
                                                " is not in ", index_path.string(),
                                                " under that file"));
      }
      in_file.insert(name);
    }
    for (const std::string& name : names) {
      if (in_file.count(name) == 0) {
        return absl::DataLossError(absl::StrCat(index_path.string(), " places tensor ",
                                                name, " in ", path.string(),
                                                " but the file does not hold it"));
      }
    }
  }
  return out;
}

bool IsAdapterDirectory(const std::string& dir) {
  return Present(fs::path(dir) / kAdapterConfigFileName);
}

absl::StatusOr<LoadedWeights> LoadPeftAdapterDirectory(const std::string& dir,
                                                       const PathRoots* roots) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("adapter directory ", dir, " does not exist"));
  }
  LoadedWeights out;
  out.directory = dir;
  const fs::path root(dir);
  for (const char* name : {kAdapterConfigFileName, "adapter_model.safetensors"}) {
    if (!Present(root / name)) {
      return absl::NotFoundError(
          absl::StrCat("adapter directory ", dir, " has no ", name,
                       "; a LoRA adapter as peft saves it holds adapter_config.json and "
                       "adapter_model.safetensors"));
    }
  }
  ASSIGN_OR_RETURN(out.config_json, snapshot::internal::ReadSmallFile(
                                        (root / kAdapterConfigFileName).string(), roots));
  RETURN_IF_ERROR(AppendFile(root / "adapter_model.safetensors", roots, &out));
  if (const fs::path manifest = root / kManifestFileName; Present(manifest)) {
    ASSIGN_OR_RETURN(const std::string text,
                     snapshot::internal::ReadSmallFile(manifest.string(), roots));
    ASSIGN_OR_RETURN(const SnapshotManifest m, ManifestFromJson(text, manifest.string()));
    out.lora_base_fingerprint = m.lora_base_fingerprint;
  }
  return out;
}

}  // namespace snapshot
}  // namespace memprofd

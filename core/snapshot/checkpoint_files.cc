#include "core/snapshot/checkpoint_files.h"

#include <filesystem>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "core/common/status_macros.h"
#include "core/snapshot/internal/file_io.h"

namespace memprofd {
namespace snapshot {
namespace {

namespace fs = std::filesystem;

absl::Status AppendOptimizerFile(const fs::path& path, LoadedCheckpoint* out) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(path.string());
  if (absl::IsNotFound(file.status())) {
    return absl::DataLossError(absl::StrCat("optimizer shard ", path.string(),
                                            " named by ", kOptimizerIndexFileName,
                                            " is missing; the checkpoint is incomplete"));
  }
  if (!file.ok()) return file.status();
  ASSIGN_OR_RETURN(TensorList tensors, (*file)->Tensors());
  for (auto& t : tensors) out->optimizer_tensors.push_back(std::move(t));
  for (const auto& [k, v] : (*file)->header().metadata) {
    if (k != "format") out->optimizer_metadata[k] = v;
  }
  return absl::OkStatus();
}

// The shard files optimizer.index.json names, in name order.
absl::StatusOr<std::set<std::string>> ReadOptimizerIndex(const fs::path& path) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("damaged optimizer index ", path.string(),
                                            ": ", why, "; take the checkpoint again"));
  };
  ASSIGN_OR_RETURN(std::string text, snapshot::internal::ReadSmallFile(path.string()));
  absl::StatusOr<Json> json = ParseJson(text);
  if (!json.ok()) return bad(json.status().message());
  const Json* map = JsonFind(*json, "weight_map");
  if (map == nullptr || !map->is_object()) return bad("no weight_map object");
  std::set<std::string> files;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string())
      return bad(absl::StrCat("weight_map[", name, "] is not a string"));
    const std::string& f = file.get_ref<const std::string&>();
    if (f.empty() || absl::StrContains(f, "/") || f == "." || f == "..") {
      return bad(
          absl::StrCat("shard name \"", f, "\" is not a file name in the directory"));
    }
    files.insert(f);
  }
  return files;
}

}  // namespace

absl::StatusOr<LoadedCheckpoint> LoadCheckpointFiles(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  const bool has_state = fs::exists(root / kTrainerStateFile, ec);
  const bool has_single = fs::exists(root / kOptimizerSingleFileName, ec);
  const bool has_index = fs::exists(root / kOptimizerIndexFileName, ec);
  if (!has_state || (!has_single && !has_index)) {
    std::string missing;
    if (!has_state) missing = kTrainerStateFile;
    if (!has_single && !has_index) {
      absl::StrAppend(&missing, missing.empty() ? "" : " and ", kOptimizerSingleFileName,
                      " (or ", kOptimizerIndexFileName, ")");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "'", dir, "' is not a checkpoint: it has no ", missing,
        ", so it holds weights only; resume needs a checkpoint (a Snapshot of kind "
        "CHECKPOINT, or one of the daemon's periodic or shutdown snapshots), or load it "
        "without resume"));
  }
  LoadedCheckpoint out;
  ASSIGN_OR_RETURN(out.trainer_state_json, snapshot::internal::ReadSmallFile(
                                               (root / kTrainerStateFile).string()));
  if (has_single) {
    RETURN_IF_ERROR(AppendOptimizerFile(root / kOptimizerSingleFileName, &out));
    return out;
  }
  ASSIGN_OR_RETURN(std::set<std::string> files,
                   ReadOptimizerIndex(root / kOptimizerIndexFileName));
  std::set<std::string> seen;
  for (const std::string& f : files) {
    const size_t before = out.optimizer_tensors.size();
    RETURN_IF_ERROR(AppendOptimizerFile(root / f, &out));
    for (size_t i = before; i < out.optimizer_tensors.size(); ++i) {
      if (!seen.insert(out.optimizer_tensors[i].first).second) {
        return absl::DataLossError(absl::StrCat("optimizer tensor ",
                                                out.optimizer_tensors[i].first,
                                                " appears in two shards of ", dir));
      }
    }
  }
  return out;
}

}  // namespace snapshot
}  // namespace memprofd

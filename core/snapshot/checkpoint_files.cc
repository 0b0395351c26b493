#include "core/snapshot/checkpoint_files.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/flat_shard.h"
#include "core/common/json.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/snapshot/internal/file_io.h"
#include "core/snapshot/internal/shard_writer.h"
#include "core/snapshot/internal/staging.h"

namespace memprofd {
namespace snapshot {
namespace {

namespace fs = std::filesystem;

absl::Status AppendOptimizerFile(const fs::path& path, const PathRoots* roots,
                                 LoadedCheckpoint* out) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(path.string(), roots);
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
absl::StatusOr<std::set<std::string>> ReadOptimizerIndex(const fs::path& path,
                                                         const PathRoots* roots) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("damaged optimizer index ", path.string(),
                                            ": ", why, "; take the checkpoint again"));
  };
  ASSIGN_OR_RETURN(std::string text,
                   snapshot::internal::ReadSmallFile(path.string(), roots));
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

constexpr char kShardingFormat[] = "memprofd-optimizer-sharding";
constexpr char kFlatLayout[] = "flat";

// The parameter an optimizer tensor ("<param>.exp_avg") belongs to.
std::string ParameterOf(const std::string& tensor) {
  const size_t dot = tensor.rfind('.');
  return dot == std::string::npos ? tensor : tensor.substr(0, dot);
}

// The flat piece `want` of a tensor of `numel` elements whose pieces of
// world size `world` are `parts` (rank order, empty pieces left out): the
// overlapping range of each old piece copied in, reading only those bytes of
// the mapped files.
at::Tensor PieceFromParts(const std::vector<at::Tensor>& parts, int64_t numel, int world,
                          const FlatShardSpec& want) {
  const FlatChunk target = ChunkOf(numel, want.rank, want.world_size);
  at::Tensor out = at::empty({target.length}, parts.front().options());
  size_t next = 0;
  for (int r = 0; r < world && next < parts.size(); ++r) {
    const FlatChunk old = ChunkOf(numel, r, world);
    if (old.length == 0) continue;
    const at::Tensor& part = parts[next++];
    const int64_t begin = std::max(old.begin, target.begin);
    const int64_t end = std::min(old.begin + old.length, target.begin + target.length);
    if (begin >= end) continue;
    out.narrow(0, begin - target.begin, end - begin)
        .copy_(part.narrow(0, begin - old.begin, end - begin));
  }
  return out;
}

// Appends every rank file the description names to `out`, each parameter's
// state assembled: its moments are the ranks' flat pieces end to end
// (core/common/flat_shard.h), reshaped to the parameter's shape, or with
// `pieces_for` that piece of them alone; its step the first rank's.
// DATA_LOSS for a file that is missing, a tensor the description does not
// name or that appears twice, a piece of the wrong size, or a parameter with
// state on some ranks and not on others.
absl::Status AppendRankFiles(const fs::path& root,
                             const OptimizerShardingDescription& sharding,
                             const PathRoots* roots, const FlatShardSpec* pieces_for,
                             LoadedCheckpoint* out) {
  std::map<std::string, const std::vector<int64_t>*> shapes;
  for (const auto& [param, shape] : sharding.parameters) shapes[param] = &shape;
  // Each tensor's piece on each rank that holds one.
  std::map<std::string, std::map<int, at::Tensor>> pieces;
  for (int r = 0; r < sharding.world_size; ++r) {
    const fs::path path = root / RankOptimizerFileName(r, sharding.world_size);
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(path, ec))) {
      return absl::DataLossError(absl::StrCat(
          "rank ", r, "'s optimizer file ", path.string(), " named by ",
          kOptimizerShardingFile, " is missing; the checkpoint is incomplete"));
    }
    LoadedCheckpoint file;
    RETURN_IF_ERROR(AppendOptimizerFile(path, roots, &file));
    for (const auto& [k, v] : file.optimizer_metadata) out->optimizer_metadata[k] = v;
    for (auto& [name, tensor] : file.optimizer_tensors) {
      if (shapes.count(ParameterOf(name)) == 0) {
        return absl::DataLossError(absl::StrCat(
            path.string(), " holds ", name, ", which ", kOptimizerShardingFile,
            " does not name; take the checkpoint again"));
      }
      if (!pieces[name].emplace(r, std::move(tensor)).second) {
        return absl::DataLossError(
            absl::StrCat("optimizer tensor ", name, " appears twice in ", root.string()));
      }
    }
  }
  for (auto& [tensor_name, by_rank] : pieces) {
    const std::string& name = tensor_name;  // a lambda below reads it
    const std::vector<int64_t>& shape = *shapes.at(ParameterOf(name));
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    auto damaged = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat("the sharded optimizer state ", name,
                                              " in ", root.string(), " ", why,
                                              "; take the checkpoint again"));
    };
    if (absl::EndsWith(name, ".step")) {
      if (by_rank.begin()->second.numel() != 1) return damaged("is not a scalar");
      out->optimizer_tensors.emplace_back(name, by_rank.begin()->second);
      continue;
    }
    std::vector<at::Tensor> parts;
    for (int r = 0; r < sharding.world_size; ++r) {
      const int64_t length = ChunkOf(numel, r, sharding.world_size).length;
      auto it = by_rank.find(r);
      if (length == 0) {
        if (it != by_rank.end()) return damaged(absl::StrCat("has a piece on rank ", r));
        continue;
      }
      if (it == by_rank.end()) return damaged(absl::StrCat("lacks rank ", r, "'s piece"));
      if (it->second.dim() != 1 || it->second.numel() != length) {
        return damaged(absl::StrCat("has a piece of ", it->second.numel(),
                                    " elements on rank ", r, " where the parameter's ",
                                    numel, " elements give it ", length));
      }
      parts.push_back(it->second);
    }
    at::Tensor assembled;
    RETURN_IF_ERROR(TorchBoundary("assembling the sharded optimizer state", [&] {
      assembled = pieces_for != nullptr
                      ? PieceFromParts(parts, numel, sharding.world_size, *pieces_for)
                      : at::cat(parts).view(shape);
    }));
    out->optimizer_tensors.emplace_back(name, std::move(assembled));
  }
  if (pieces_for != nullptr) out->pieces_of = *pieces_for;
  return absl::OkStatus();
}

}  // namespace

std::string RankOptimizerFileName(int rank, int world_size) {
  return absl::StrFormat("%s-rank-%05d-of-%05d.safetensors", kOptimizerFilePrefix, rank,
                         world_size);
}

std::string OptimizerShardingToJson(const OptimizerShardingDescription& d) {
  Json parameters = Json::array();
  for (const auto& [param, shape] : d.parameters) {
    parameters.push_back({{"parameter", param}, {"shape", shape}});
  }
  Json files = Json::array();
  for (int r = 0; r < d.world_size; ++r)
    files.push_back(RankOptimizerFileName(r, d.world_size));
  const Json v = {{"format", kShardingFormat}, {"world_size", d.world_size},
                  {"level", d.level},          {"layout", kFlatLayout},
                  {"files", std::move(files)}, {"parameters", std::move(parameters)}};
  return DumpJson(v, 2) + "\n";
}

absl::StatusOr<OptimizerShardingDescription> OptimizerShardingFromJson(
    absl::string_view text, absl::string_view path) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("optimizer sharding description ", path,
                                            " is damaged: ", why,
                                            "; take the checkpoint again"));
  };
  absl::StatusOr<Json> v = ParseJson(text);
  if (!v.ok()) return bad(v.status().message());
  if (!v->is_object()) return bad("not a JSON object");
  const Json* format = JsonFind(*v, "format");
  if (format == nullptr || !format->is_string() ||
      format->get<std::string>() != kShardingFormat) {
    return bad(absl::StrCat("format is not \"", kShardingFormat, "\""));
  }
  const Json* layout = JsonFind(*v, "layout");
  if (layout == nullptr || !layout->is_string() ||
      layout->get<std::string>() != kFlatLayout) {
    return absl::FailedPreconditionError(absl::StrCat(
        "optimizer sharding description ", path,
        " does not describe flat pieces (layout \"", kFlatLayout,
        "\"): an earlier memprofd wrote it with whole parameters per rank, "
        "which this one does not read; resume from a checkpoint this version wrote"));
  }
  OptimizerShardingDescription d;
  const Json* world = JsonFind(*v, "world_size");
  int64_t world_size = 0;
  if (world == nullptr || !JsonToInt64(*world, &world_size) || world_size < 1 ||
      world_size > 99999) {
    return bad("world_size is not an integer in [1, 99999]");
  }
  d.world_size = static_cast<int>(world_size);
  const Json* level = JsonFind(*v, "level");
  if (level == nullptr || !level->is_string()) return bad("level is not a string");
  d.level = level->get<std::string>();
  const Json* parameters = JsonFind(*v, "parameters");
  if (parameters == nullptr || !parameters->is_array()) {
    return bad("parameters is not an array");
  }
  for (const Json& o : *parameters) {
    const Json* param = o.is_object() ? JsonFind(o, "parameter") : nullptr;
    const Json* shape = o.is_object() ? JsonFind(o, "shape") : nullptr;
    std::vector<int64_t> dims;
    bool ok = param != nullptr && param->is_string() && shape != nullptr &&
              shape->is_array() && shape->size() <= 8;
    for (size_t i = 0; ok && i < shape->size(); ++i) {
      int64_t dim = -1;
      ok = JsonToInt64((*shape)[i], &dim) && dim >= 0 && dim <= (int64_t{1} << 40);
      dims.push_back(dim);
    }
    if (!ok) {
      return bad(
          "a parameters entry is not {parameter, shape} with at most 8 dimensions "
          "of at most 2^40");
    }
    d.parameters.emplace_back(param->get<std::string>(), std::move(dims));
  }
  return d;
}

absl::StatusOr<int64_t> WriteRankOptimizerFile(
    const std::string& dir, int rank, int world_size, const TensorList& tensors,
    const std::map<std::string, std::string>& metadata, int64_t staging_bytes) {
  const fs::path final_path = fs::path(dir) / RankOptimizerFileName(rank, world_size);
  std::error_code ec;
  if (fs::exists(final_path, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat(final_path.string(), " exists; another rank wrote it"));
  }
  const fs::path partial =
      fs::path(dir) / absl::StrCat(".partial-", RankOptimizerFileName(rank, world_size));
  fs::remove(partial, ec);  // a leftover of a rank killed while writing
  std::vector<snapshot::internal::ShardTensor> items;
  bool on_device = false;
  for (const auto& [name, t] : tensors) {
    RETURN_IF_ERROR(snapshot::internal::CheckTensorWritable(name, t));
    on_device = on_device || !t.device().is_cpu();
    items.push_back({name, t, t.scalar_type()});
  }
  ASSIGN_OR_RETURN(auto staging,
                   snapshot::internal::StagingBuffer::Create(staging_bytes, on_device));
  absl::StatusOr<int64_t> size = snapshot::internal::WriteShard(
      partial.string(), items, *staging, [](int64_t) { return absl::OkStatus(); },
      metadata);
  if (size.ok() && ::rename(partial.c_str(), final_path.c_str()) != 0) {
    size = snapshot::internal::ErrnoStatus(errno,
                                           absl::StrCat("renaming ", partial.string()));
  }
  if (size.ok()) {
    if (absl::Status synced = snapshot::internal::SyncDirectory(dir); !synced.ok())
      return synced;
  } else {
    fs::remove(partial, ec);
  }
  return size;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointFiles(const std::string& dir,
                                                     const PathRoots* roots,
                                                     const FlatShardSpec* pieces_for) {
  const fs::path root(dir);
  std::error_code ec;
  // A link counts as present: where it leads is for the open to judge.
  auto present = [&](absl::string_view name) {
    return fs::exists(fs::symlink_status(root / std::string(name), ec));
  };
  const bool has_state = present(kTrainerStateFile);
  const bool has_single = present(kOptimizerSingleFileName);
  const bool has_index = present(kOptimizerIndexFileName);
  const bool has_ranks = present(kOptimizerShardingFile);
  if (!has_state || (!has_single && !has_index && !has_ranks)) {
    std::string missing;
    if (!has_state) missing = kTrainerStateFile;
    if (!has_single && !has_index && !has_ranks) {
      absl::StrAppend(&missing, missing.empty() ? "" : " and ", kOptimizerSingleFileName,
                      " (or ", kOptimizerIndexFileName, ", or ", kOptimizerShardingFile,
                      ")");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "'", dir, "' is not a checkpoint: it has no ", missing,
        ", so it holds weights only; resume needs a checkpoint (a Snapshot of kind "
        "CHECKPOINT, or one of the daemon's periodic or shutdown snapshots), or load it "
        "without resume"));
  }
  LoadedCheckpoint out;
  ASSIGN_OR_RETURN(
      out.trainer_state_json,
      snapshot::internal::ReadSmallFile((root / kTrainerStateFile).string(), roots));
  if (has_ranks) {
    const std::string path = (root / kOptimizerShardingFile).string();
    ASSIGN_OR_RETURN(const std::string text,
                     snapshot::internal::ReadSmallFile(path, roots));
    ASSIGN_OR_RETURN(out.sharding, OptimizerShardingFromJson(text, path));
    RETURN_IF_ERROR(AppendRankFiles(root, *out.sharding, roots, pieces_for, &out));
    return out;
  }
  if (has_single) {
    RETURN_IF_ERROR(AppendOptimizerFile(root / kOptimizerSingleFileName, roots, &out));
    return out;
  }
  ASSIGN_OR_RETURN(std::set<std::string> files,
                   ReadOptimizerIndex(root / kOptimizerIndexFileName, roots));
  std::set<std::string> seen;
  for (const std::string& f : files) {
    const size_t before = out.optimizer_tensors.size();
    RETURN_IF_ERROR(AppendOptimizerFile(root / f, roots, &out));
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

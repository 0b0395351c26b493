#include "core/snapshot/writer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/common/attribution.h"
#include "core/common/json.h"
#include "core/common/option_status.h"
#include "core/common/phase.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/common/utf8.h"
#include "core/snapshot/internal/file_io.h"
#include "core/snapshot/internal/shard_writer.h"
#include "core/snapshot/internal/staging.h"
#include "core/snapshot/shard_plan.h"
#include "core/snapshot/snapshot_store.h"

namespace memprofd {
namespace snapshot {
namespace {

namespace fs = std::filesystem;
using snapshot::internal::ErrnoStatus;

constexpr char kTiedHead[] = "lm_head.weight";

at::ScalarType OutputType(at::ScalarType in, SnapshotDtype dtype) {
  if (!at::isFloatingType(in)) return in;
  switch (dtype) {
    case SnapshotDtype::kKeep:
      return in;
    case SnapshotDtype::kBFloat16:
      return at::kBFloat16;
    case SnapshotDtype::kFloat16:
      return at::kHalf;
    case SnapshotDtype::kFloat32:
      return at::kFloat;
  }
  return in;
}

// config.json's name of a floating dtype, as transformers writes it.
const char* TorchDtypeName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    default:
      return "float32";
  }
}

// The dtype config.json must name for `items`: the one their floating
// tensors are written in, or float32 when they differ (transformers' default
// from_pretrained loads every weight in the dtype the config names, so a
// narrower label would round the wider tensors); nullopt when none floats.
std::optional<at::ScalarType> WrittenFloatType(
    const std::vector<snapshot::internal::ShardTensor>& items) {
  std::optional<at::ScalarType> type;
  for (const auto& item : items) {
    if (!at::isFloatingType(item.out_dtype)) continue;
    if (type && *type != item.out_dtype) return at::kFloat;
    type = item.out_dtype;
  }
  return type;
}

// config.json's text as written: `config_json` with "torch_dtype" (and
// "dtype", which transformers 5 reads first, when the text has it) naming
// `written`, the dtype of the tensors beside it.
absl::StatusOr<std::string> ConfigText(absl::string_view config_json,
                                       std::optional<at::ScalarType> written) {
  if (config_json.empty()) return std::string();
  absl::StatusOr<Json> config = ParseJson(config_json);
  if (!config.ok() || !config->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json text is not a JSON object: ",
                     config.ok() ? "wrong type" : config.status().message()));
  }
  if (!written) return std::string(config_json);
  const Json name = TorchDtypeName(*written);
  const bool has_dtype = config->contains("dtype");
  if (JsonFind(*config, "torch_dtype") != nullptr && (*config)["torch_dtype"] == name &&
      (!has_dtype || (*config)["dtype"] == name)) {
    return std::string(config_json);  // already true: written as it came
  }
  (*config)["torch_dtype"] = name;
  if (has_dtype) (*config)["dtype"] = name;
  return DumpJson(*config, 2) + "\n";
}

// Why a snapshot carries the files it does, for its manifest.
std::string CarriedNote(const SnapshotOptions& options) {
  if (absl::StartsWith(options.model_source, "preset:")) {
    return "none: the model is a preset, which has no tokenizer or generation config";
  }
  if (options.carried_files == nullptr) return "none were given to the writer";
  std::string note =
      options.carried_files->files.empty()
          ? absl::StrCat("none: ",
                         options.model_source.empty() ? "the model's directory"
                                                      : options.model_source,
                         " has no generation config or tokenizer files")
          : absl::StrCat("copied from ", options.model_source);
  if (!options.carried_files->skipped.empty()) {
    absl::StrAppend(
        &note, "; not carried: ", absl::StrJoin(options.carried_files->skipped, "; "));
  }
  return note;
}

// Creates the root if needed and checks it is a directory.
absl::Status PrepareRoot(const std::string& root) {
  std::error_code ec;
  if (fs::exists(root, ec)) {
    if (!fs::is_directory(root, ec)) {
      return OptionError(
          absl::StatusCode::kFailedPrecondition, "snapshot_root",
          absl::StrCat("snapshot_root ", root, " is not a directory; give a directory"));
    }
    return absl::OkStatus();
  }
  fs::create_directories(root, ec);
  if (ec) {
    absl::Status s =
        ErrnoStatus(ec.value(), absl::StrCat("creating snapshot root ", root));
    if (s.code() == absl::StatusCode::kPermissionDenied) {
      return AboutOption(s, "snapshot_root");
    }
    return OptionError(absl::StatusCode::kFailedPrecondition, "snapshot_root",
                       absl::StrCat(s.message(), "; give a writable directory"));
  }
  return absl::OkStatus();
}

// Renames `from` to `to` unless `to` exists (renameat2 RENAME_NOREPLACE,
// falling back to a check where the filesystem lacks it).
absl::Status RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  int err = errno;
  if (err == EINVAL || err == ENOSYS) {
    std::error_code ec;
    if (fs::exists(to, ec)) {
      err = EEXIST;
    } else if (::rename(from.c_str(), to.c_str()) == 0) {
      return absl::OkStatus();
    } else {
      err = errno;
    }
  }
  if (err == EEXIST || err == ENOTEMPTY) {
    return absl::AlreadyExistsError(
        absl::StrCat("snapshot ", to, " appeared while writing; choose another name"));
  }
  return ErrnoStatus(err, absl::StrCat("publishing snapshot ", to));
}

}  // namespace

absl::StatusOr<SnapshotManifest> SnapshotWriter::Write(
    absl::string_view name, const TensorList& tensors, absl::string_view config_json,
    const SnapshotOptions& options, const SnapshotProgressFn& progress,
    const SnapshotCancelFn& cancel, TensorAccess* access) const {
  return WriteImpl(name, tensors, config_json, nullptr, options, progress, cancel,
                   access);
}

absl::StatusOr<SnapshotManifest> SnapshotWriter::WriteCheckpoint(
    absl::string_view name, const TensorList& tensors, absl::string_view config_json,
    const CheckpointPayload& checkpoint, const SnapshotOptions& options,
    const SnapshotProgressFn& progress, const SnapshotCancelFn& cancel,
    TensorAccess* access) const {
  return WriteImpl(name, tensors, config_json, &checkpoint, options, progress, cancel,
                   access);
}

absl::StatusOr<SnapshotManifest> SnapshotWriter::WriteImpl(
    absl::string_view name, const TensorList& tensors, absl::string_view config_json,
    const CheckpointPayload* checkpoint, const SnapshotOptions& options,
    const SnapshotProgressFn& progress, const SnapshotCancelFn& cancel,
    TensorAccess* access) const {
  const absl::Time start = absl::Now();
  std::optional<PhaseScope> phase;
  if (options.enter_snapshot_phase) phase.emplace(Phase::kSnapshot);
  RETURN_IF_ERROR(ValidateSnapshotName(name));
  if (options.max_shard_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_shard_size must be positive, got ", options.max_shard_size));
  }
  if (options.staging_bytes < snapshot::internal::StagingBuffer::kMinBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging_bytes must be at least ", snapshot::internal::StagingBuffer::kMinBytes,
        ", got ", options.staging_bytes));
  }

  // What to write: every tensor but a tied head, in state-dict order.
  std::vector<snapshot::internal::ShardTensor> items;
  std::set<std::string> seen;
  bool dropped_head = false;
  bool on_device = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [tensor_name, tensor] = tensors[i];
    if (!seen.insert(tensor_name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name ", tensor_name, " appears twice in the state dict"));
    }
    if (options.tie_word_embeddings && tensor_name == kTiedHead) {
      dropped_head = true;
      continue;
    }
    RETURN_IF_ERROR(snapshot::internal::CheckTensorWritable(tensor_name, tensor));
    on_device = on_device || !tensor.device().is_cpu();
    items.push_back({tensor_name, tensor, OutputType(tensor.scalar_type(), options.dtype),
                     static_cast<int64_t>(i)});
  }
  // An adapter snapshot is peft's layout: its config as given
  // (adapter_config.json), its tensors in one adapter_model.safetensors (peft
  // reads no sharded adapter); as a checkpoint, the adapters' optimizer
  // state and the trainer state beside them.
  const bool adapter = options.kind == SnapshotKind::kAdapter;
  std::string config;
  if (adapter) {
    config = std::string(config_json);
  } else {
    ASSIGN_OR_RETURN(config, ConfigText(config_json, WrittenFloatType(items)));
  }

  // A checkpoint's optimizer tensors: always in their own dtype.
  std::vector<snapshot::internal::ShardTensor> opt_items;
  if (checkpoint != nullptr) {
    for (const auto& item : items) {
      if (item.out_dtype != item.tensor.scalar_type()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a checkpoint keeps the weights in their own dtype so that training resumes "
            "exactly, but dtype ",
            SnapshotDtypeName(options.dtype), " would convert ", item.name,
            "; use dtype keep, or take a weights snapshot"));
      }
    }
    for (const auto& [tensor_name, tensor] : checkpoint->optimizer_tensors) {
      if (!seen.insert(tensor_name).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer tensor name ", tensor_name,
                         " appears twice or is a weight's name"));
      }
      RETURN_IF_ERROR(snapshot::internal::CheckTensorWritable(tensor_name, tensor));
      on_device = on_device || !tensor.device().is_cpu();
      opt_items.push_back({tensor_name, tensor, tensor.scalar_type()});
    }
  }

  std::vector<ShardEntry> entries;
  std::map<std::string, const snapshot::internal::ShardTensor*> by_name;
  for (size_t i = 0; i < items.size(); ++i) {
    entries.push_back({items[i].name,
                       items[i].tensor.numel() *
                           static_cast<int64_t>(c10::elementSize(items[i].out_dtype)),
                       static_cast<int64_t>(i)});
    by_name[items[i].name] = &items[i];
  }
  const ShardPlan plan =
      adapter
          ? PlanShards(entries, std::numeric_limits<int64_t>::max(), kAdapterFilePrefix)
          : PlanShards(entries, options.max_shard_size);
  std::vector<ShardEntry> opt_entries;
  std::map<std::string, const snapshot::internal::ShardTensor*> opt_by_name;
  for (size_t i = 0; i < opt_items.size(); ++i) {
    opt_entries.push_back(
        {opt_items[i].name,
         opt_items[i].tensor.numel() *
             static_cast<int64_t>(c10::elementSize(opt_items[i].out_dtype)),
         static_cast<int64_t>(items.size() + i)});
    opt_by_name[opt_items[i].name] = &opt_items[i];
  }
  ShardPlan opt_plan = PlanShards(opt_entries,
                                  checkpoint != nullptr && checkpoint->sharding
                                      ? std::numeric_limits<int64_t>::max()
                                      : options.max_shard_size,
                                  kOptimizerFilePrefix);
  if (checkpoint != nullptr && checkpoint->sharding) {
    // Rank 0's file: one, whatever its size (every rank writes one).
    opt_plan.shards[0].file_name =
        RankOptimizerFileName(0, checkpoint->sharding->world_size);
  }
  const int64_t total_bytes = plan.total_size + (checkpoint ? opt_plan.total_size : 0);

  RETURN_IF_ERROR(PrepareRoot(root_));
  const std::string final_dir = (fs::path(root_) / std::string(name)).string();
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("snapshot ", final_dir,
                     " already exists; choose another name or delete it first"));
  }
  std::string tmp_dir =
      (fs::path(root_) / absl::StrCat(kTempPrefix, name, "-XXXXXX")).string();
  if (::mkdtemp(tmp_dir.data()) == nullptr) {
    const int err = errno;
    absl::Status s = ErrnoStatus(
        err, absl::StrCat("creating a temporary directory in snapshot root ", root_));
    if (s.code() == absl::StatusCode::kPermissionDenied ||
        s.code() == absl::StatusCode::kResourceExhausted) {
      return OptionError(s.code(), "snapshot_root",
                         absl::StrCat(s.message(), "; make snapshot_root writable"));
    }
    return OptionError(
        absl::StatusCode::kFailedPrecondition, "snapshot_root",
        absl::StrCat(s.message(), "; make snapshot_root a writable directory"));
  }
  bool published = false;
  absl::Cleanup remove_tmp = [&] {
    if (!published) {
      std::error_code rm_ec;
      fs::remove_all(tmp_dir, rm_ec);
    }
  };

  CategoryScope category(Category::kSnapshotStaging);
  ASSIGN_OR_RETURN(auto staging, snapshot::internal::StagingBuffer::Create(
                                     options.staging_bytes, on_device));
  SnapshotManifest manifest;
  manifest.name = std::string(name);
  manifest.directory = fs::absolute(final_dir).lexically_normal().string();
  manifest.total_size = total_bytes;
  manifest.num_tensors = static_cast<int64_t>(items.size() + opt_items.size());
  manifest.num_shards = static_cast<int64_t>(plan.shards.size());
  manifest.dtype = std::string(SnapshotDtypeName(options.dtype));
  manifest.max_shard_size = options.max_shard_size;
  manifest.dropped_tied_lm_head = dropped_head;
  manifest.staging_bytes = staging->bytes();
  manifest.global_step = options.global_step;
  manifest.create_time = start;
  manifest.kind = std::string(
      SnapshotKindName(checkpoint ? SnapshotKind::kCheckpoint : options.kind));
  manifest.optimizer_bytes = checkpoint ? opt_plan.total_size : 0;

  // Tensors the access gathers for the write. The hooks bracket each
  // tensor's bytes, so one is held at a time: the peak is the largest.
  snapshot::internal::TensorHooks hooks;
  hooks.before = [&](const snapshot::internal::ShardTensor& t) -> absl::Status {
    if (t.source < 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(const int64_t bytes, access->Acquire(static_cast<size_t>(t.source)));
    manifest.peak_gathered_bytes = std::max(manifest.peak_gathered_bytes, bytes);
    return absl::OkStatus();
  };
  hooks.after = [&](const snapshot::internal::ShardTensor& t) {
    if (t.source >= 0) access->Release(static_cast<size_t>(t.source));
  };
  int64_t done = 0;
  auto check_cancel = [&]() -> absl::Status {
    if (cancel && cancel()) {
      return absl::CancelledError(absl::StrCat("snapshot ", name, " cancelled after ",
                                               done, " of ", total_bytes,
                                               " bytes; nothing was published"));
    }
    return absl::OkStatus();
  };
  if (progress) progress(0, total_bytes);
  RETURN_IF_ERROR(check_cancel());
  auto write_shards =
      [&](const ShardPlan& shards,
          const std::map<std::string, const snapshot::internal::ShardTensor*>& lookup,
          const std::map<std::string, std::string>& metadata) -> absl::Status {
    for (const Shard& shard : shards.shards) {
      std::vector<snapshot::internal::ShardTensor> shard_items;
      for (const std::string& n : shard.names) shard_items.push_back(*lookup.at(n));
      const std::string path = (fs::path(tmp_dir) / shard.file_name).string();
      ASSIGN_OR_RETURN(const int64_t size, snapshot::internal::WriteShard(
                                               path, shard_items, *staging,
                                               [&](int64_t bytes) {
                                                 done += bytes;
                                                 if (progress)
                                                   progress(done, total_bytes);
                                                 return check_cancel();
                                               },
                                               metadata, access ? &hooks : nullptr));
      manifest.files.push_back({shard.file_name, size});
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(write_shards(plan, by_name, {}));
  auto write_small = [&](const char* file, const std::string& text) -> absl::Status {
    RETURN_IF_ERROR(
        snapshot::internal::WriteFileSynced((fs::path(tmp_dir) / file).string(), text));
    manifest.files.push_back({file, static_cast<int64_t>(text.size())});
    return absl::OkStatus();
  };
  if (plan.sharded()) RETURN_IF_ERROR(write_small(kIndexFileName, plan.IndexJson()));
  if (!config.empty()) {
    RETURN_IF_ERROR(
        write_small(adapter ? kAdapterConfigFileName : kConfigFileName, config));
  }
  manifest.model_source = options.model_source;
  manifest.lora_base_fingerprint = options.lora_base_fingerprint;
  if (options.carried_files != nullptr) {
    for (const CarriedFile& f : options.carried_files->files) {
      if (!IsCarriedFileName(f.name)) {
        return absl::InvalidArgumentError(absl::StrCat("carried file name ", Echo(f.name),
                                                       " is not one a snapshot carries"));
      }
      RETURN_IF_ERROR(write_small(f.name.c_str(), f.bytes));
      manifest.carried_files.push_back(f.name);
    }
  }
  manifest.carried_note = CarriedNote(options);
  if (checkpoint != nullptr) {
    RETURN_IF_ERROR(write_shards(opt_plan, opt_by_name, checkpoint->optimizer_metadata));
    if (checkpoint->sharding) {
      // The other ranks' files, complete already, join rank 0's before the
      // one rename publishes them all.
      const int world = checkpoint->sharding->world_size;
      for (int r = 1; r < world; ++r) {
        const std::string file = RankOptimizerFileName(r, world);
        const fs::path from = fs::path(checkpoint->other_ranks_dir) / file;
        std::error_code size_ec;
        const int64_t size = static_cast<int64_t>(fs::file_size(from, size_ec));
        if (size_ec || ::rename(from.c_str(), (fs::path(tmp_dir) / file).c_str()) != 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              "rank ", r, "'s optimizer file ", from.string(),
              " is not there: that rank did not write its optimizer state there (every "
              "rank must see the snapshot root as the same shared directory); nothing "
              "was published"));
        }
        manifest.files.push_back({file, size});
        manifest.optimizer_bytes += size;
      }
      RETURN_IF_ERROR(write_small(kOptimizerShardingFile,
                                  OptimizerShardingToJson(*checkpoint->sharding)));
    } else if (opt_plan.sharded()) {
      RETURN_IF_ERROR(write_small(kOptimizerIndexFileName, opt_plan.IndexJson()));
    }
    RETURN_IF_ERROR(write_small(kTrainerStateFile, checkpoint->trainer_state_json));
  }
  manifest.peak_extra_host_bytes = staging->allocated_bytes() + options.held_host_bytes;
  manifest.peak_extra_device_bytes = staging->peak_device_temp_bytes();
  for (const SnapshotFile& f : manifest.files) manifest.bytes_written += f.bytes;
  manifest.duration_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  manifest.throughput_bytes_per_second =
      manifest.duration_seconds > 0 ? manifest.bytes_written / manifest.duration_seconds
                                    : 0;
  RETURN_IF_ERROR(snapshot::internal::WriteFileSynced(
      (fs::path(tmp_dir) / kManifestFileName).string(), ManifestToJson(manifest)));
  RETURN_IF_ERROR(snapshot::internal::SyncDirectory(tmp_dir));
  RETURN_IF_ERROR(check_cancel());
  RETURN_IF_ERROR(RenameNoReplace(tmp_dir, final_dir));
  published = true;
  if (absl::Status synced = snapshot::internal::SyncDirectory(root_); !synced.ok()) {
    return absl::Status(synced.code(),
                        absl::StrCat("snapshot ", final_dir,
                                     " is complete and visible but its rename may not "
                                     "survive a crash: ",
                                     synced.message()));
  }
  manifest.duration_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  manifest.throughput_bytes_per_second =
      manifest.duration_seconds > 0 ? manifest.bytes_written / manifest.duration_seconds
                                    : 0;
  return manifest;
}

absl::StatusOr<AsyncSnapshotSource> CopyForAsyncSnapshot(const TensorList& tensors,
                                                         const SnapshotOptions& options,
                                                         TensorAccess* access) {
  AsyncSnapshotSource out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, source] = tensors[i];
    if (options.tie_word_embeddings && name == kTiedHead) continue;
    RETURN_IF_ERROR(snapshot::internal::CheckTensorWritable(name, source));
    if (access != nullptr) RETURN_IF_ERROR(access->Acquire(i).status());
    absl::Cleanup release = [&] {
      if (access != nullptr) access->Release(i);
    };
    // C++17 lambdas cannot capture a structured binding (clang refuses it).
    const at::Tensor& tensor = source;
    at::Tensor copy;
    ModuleScope module(InternModule(name));
    CategoryScope category(Category::kSnapshotStaging);
    RETURN_IF_ERROR(TorchBoundary(absl::StrCat("copying ", name, " to host"), [&] {
      c10::NoGradGuard no_grad;
      copy = at::empty(tensor.sizes(), at::TensorOptions().dtype(OutputType(
                                           tensor.scalar_type(), options.dtype)));
      copy.copy_(tensor);
    }));
    out.host_bytes += static_cast<int64_t>(copy.nbytes());
    out.tensors.emplace_back(name, std::move(copy));
  }
  return out;
}

}  // namespace snapshot
}  // namespace memprofd

#ifndef MEMPROFD_CORE_SNAPSHOT_SNAPSHOT_OPTIONS_H_
#define MEMPROFD_CORE_SNAPSHOT_SNAPSHOT_OPTIONS_H_

// Options of one snapshot. Plain data, no LibTorch: the server fills it from
// the request and flags.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/snapshot/carried_files.h"
#include "core/snapshot/shard_plan.h"

namespace memprofd {
namespace snapshot {

// The dtype floating-point tensors are written in; integer and bool tensors
// are always written as they are.
enum class SnapshotDtype { kKeep, kBFloat16, kFloat16, kFloat32 };

// "keep", "bf16", "fp16", "fp32".
absl::string_view SnapshotDtypeName(SnapshotDtype dtype);
// Accepts the names above and "bfloat16", "float16", "float32" (any case).
// INVALID_ARGUMENT listing the choices otherwise.
absl::StatusOr<SnapshotDtype> ParseSnapshotDtype(absl::string_view text);

// What a snapshot holds. kWeights: the Hugging Face files (config.json,
// model*.safetensors, the index when sharded). kCheckpoint: those plus the
// training state a resume needs, optimizer*.safetensors (every parameter's
// AdamW moments and step) and trainer_state.json (see core/train/
// trainer_state.h); transformers loads either directory unchanged.
// kAdapter: a model's LoRA adapters as peft saves them (adapter_config.json,
// adapter_model.safetensors), which peft.PeftModel.from_pretrained loads onto
// the base model. kMerged: the Hugging Face files of a model with LoRA
// adapters, each folded into its projection (W + scaling · B·A, as peft's
// merge_and_unload does), which transformers loads alone.
enum class SnapshotKind { kWeights, kCheckpoint, kAdapter, kMerged };

// "weights" / "checkpoint" / "adapter" / "merged".
absl::string_view SnapshotKindName(SnapshotKind kind);
// Parses those names (any case); INVALID_ARGUMENT listing them otherwise.
absl::StatusOr<SnapshotKind> ParseSnapshotKind(absl::string_view text);

struct SnapshotOptions;
// OK unless `options` asks for a checkpoint whose weights would be converted:
// INVALID_ARGUMENT then (a checkpoint keeps the model's float32 weights as
// they are, since a resume from converted weights cannot be exact), saying
// to use dtype keep or a weights snapshot.
absl::Status CheckCheckpointDtype(const SnapshotOptions& options);

struct SnapshotOptions {
  // Bytes per shard file (see ParseShardSize for the accepted strings).
  int64_t max_shard_size = kDefaultMaxShardSize;
  SnapshotDtype dtype = SnapshotDtype::kKeep;
  // Recorded in the manifest; SnapshotWriter::Write with a CheckpointPayload
  // sets it to kCheckpoint.
  SnapshotKind kind = SnapshotKind::kWeights;
  // The one host buffer every tensor is streamed through; at least 4096.
  int64_t staging_bytes = int64_t{64} << 20;
  // Drop "lm_head.weight" (tied to the input embeddings), as transformers
  // does when config.json says tie_word_embeddings; decided by the caller
  // from the config, never from pointers.
  bool tie_word_embeddings = false;
  // Recorded in the manifest.
  int64_t global_step = 0;
  // Written beside config.json, each as it is (the directory the model was
  // loaded from had them); null: none. Shared, since an async snapshot's
  // writer thread reads them while the model may be replaced.
  std::shared_ptr<const CarriedFiles> carried_files;
  // Recorded in the manifest: "preset:tiny" or the model's directory.
  std::string model_source;
  // Recorded in the manifest of a LoRA model's snapshot: the fingerprint of
  // the frozen base its adapters trained on (LlamaModel::BaseFingerprint).
  std::string lora_base_fingerprint;
  // Host memory the caller holds for this snapshot (the copies of an async
  // snapshot, see CopyForAsyncSnapshot); added to the manifest's
  // peak_extra_host_bytes.
  int64_t held_host_bytes = 0;
  // Write marks the process-wide phase (core/common/phase.h) as kSnapshot
  // while it runs. That phase belongs to the owner thread: set false when
  // writing from a background thread (async mode).
  bool enter_snapshot_phase = true;
};

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_SNAPSHOT_OPTIONS_H_

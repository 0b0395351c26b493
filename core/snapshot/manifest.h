#ifndef MEMPROFD_CORE_SNAPSHOT_MANIFEST_H_
#define MEMPROFD_CORE_SNAPSHOT_MANIFEST_H_

// What a published snapshot holds and how it was written. Plain data (no
// LibTorch): the server maps it to the API; it is also stored as
// memprofd_manifest.json inside the snapshot so that listing is cheap.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace memprofd {
namespace snapshot {

inline constexpr char kManifestFileName[] = "memprofd_manifest.json";

struct SnapshotFile {
  std::string name;  // relative to the snapshot directory
  int64_t bytes = 0;
};

struct SnapshotManifest {
  std::string name;
  std::string directory;  // absolute path of the published snapshot
  // model*.safetensors, the index when sharded, config.json, and for a
  // checkpoint optimizer*.safetensors (+ optimizer.index.json when sharded)
  // and trainer_state.json (not the manifest itself), in write order.
  std::vector<SnapshotFile> files;
  int64_t total_size = 0;     // tensor data bytes, as in the index
  int64_t bytes_written = 0;  // sum of files[].bytes
  int64_t num_tensors = 0;
  int64_t num_shards = 0;
  std::string dtype;  // "keep", "bf16", "fp16" or "fp32"
  int64_t max_shard_size = 0;
  bool dropped_tied_lm_head = false;
  double duration_seconds = 0;
  double throughput_bytes_per_second = 0;
  // Host memory the writer allocated: the staging buffer (allocated once, at
  // the first tensor that needs it: a device tensor, a dtype conversion or a
  // non-contiguous layout; 0 when every tensor was written from its memory).
  int64_t peak_extra_host_bytes = 0;
  // Device temporaries LibTorch may have made (non-contiguous device tensors:
  // one chunk); 0 for CPU and disk sources.
  int64_t peak_extra_device_bytes = 0;
  // Bytes of tensors held only while they were written (a fully sharded
  // run's parameters, all-gathered from the ranks' shards), at their
  // peak: at most the largest tensor, as one is held at a time. On the
  // compute device.
  int64_t peak_gathered_bytes = 0;
  int64_t staging_bytes = 0;
  int64_t global_step = 0;
  absl::Time create_time = absl::UnixEpoch();
  // SnapshotKindName ("weights", "checkpoint", ...); manifests written before
  // kinds existed read as "weights".
  std::string kind = "weights";
  // A checkpoint's optimizer tensor bytes (part of total_size).
  int64_t optimizer_bytes = 0;
  // Where the model came from ("preset:tiny" or the directory it was
  // loaded from; empty when the writer was not told), and the files of that
  // directory copied beside config.json (carried_files.h): its generation
  // settings and tokenizer. A preset has none; carried_note says why when
  // nothing was carried.
  std::string model_source;
  std::vector<std::string> carried_files;
  std::string carried_note;
  // A LoRA model's adapter or checkpoint snapshot: the fingerprint of the
  // frozen base the adapters trained on, which LoadModel checks when the
  // directory is loaded as lora_adapter; empty otherwise.
  std::string lora_base_fingerprint;

  bool is_checkpoint() const { return kind == "checkpoint"; }
  bool is_adapter() const { return kind == "adapter"; }
};

// The manifest as JSON (indent 2) and back. ManifestFromJson: DATA_LOSS naming
// `path` when the text is not a manifest.
std::string ManifestToJson(const SnapshotManifest& manifest);
absl::StatusOr<SnapshotManifest> ManifestFromJson(absl::string_view text,
                                                  absl::string_view path);

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_MANIFEST_H_

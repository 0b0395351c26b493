#ifndef MEMPROFD_CORE_SNAPSHOT_CHECKPOINT_FILES_H_
#define MEMPROFD_CORE_SNAPSHOT_CHECKPOINT_FILES_H_

// The files a checkpoint adds to a snapshot directory, beside the Hugging
// Face ones (which transformers loads without looking at these):
// - optimizer.safetensors, or when larger than max_shard_size
//   optimizer-0000K-of-0000N.safetensors with optimizer.index.json (the
//   model index's format; not named *.safetensors.index.json, so that a
//   directory keeps exactly one index of that name for transformers and
//   accelerate): tensors "<param>.exp_avg", "<param>.exp_avg_sq" and
//   "<param>.step", the optimizer's hyperparameters in __metadata__;
// - trainer_state.json (core/train/trainer_state.h).

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/snapshot/safetensors.h"

namespace memprofd {
namespace snapshot {

inline constexpr char kOptimizerFilePrefix[] = "optimizer";
inline constexpr char kOptimizerSingleFileName[] = "optimizer.safetensors";
inline constexpr char kOptimizerIndexFileName[] = "optimizer.index.json";
inline constexpr char kTrainerStateFile[] = "trainer_state.json";

// What a checkpoint writes besides the weights.
struct CheckpointPayload {
  // Named optimizer tensors, live (streamed like the weights, never copied
  // whole); written in their own dtype whatever SnapshotOptions::dtype says.
  TensorList optimizer_tensors;
  // Added to the optimizer files' __metadata__ (with "format": "pt").
  std::map<std::string, std::string> optimizer_metadata;
  // trainer_state.json's text.
  std::string trainer_state_json;
};

// A checkpoint's training state as read back.
struct LoadedCheckpoint {
  // Memory-mapped (copy-on-write) tensors of the optimizer files.
  TensorList optimizer_tensors;
  std::map<std::string, std::string> optimizer_metadata;
  std::string trainer_state_json;
};

// Reads the checkpoint files of `dir`. FAILED_PRECONDITION naming what is
// missing when `dir` has no trainer_state.json or no optimizer file (a
// weights-only snapshot or a plain Hugging Face directory); DATA_LOSS
// naming the file for a corrupt or truncated optimizer file or index, a
// shard the index names that is missing, or a tensor in two shards;
// INVALID_ARGUMENT for dtypes memprofd does not handle. Thread-safe.
absl::StatusOr<LoadedCheckpoint> LoadCheckpointFiles(const std::string& dir);

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_CHECKPOINT_FILES_H_

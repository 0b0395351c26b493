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
// A checkpoint of a data-parallel run whose optimizer state is sharded (each
// rank holds the AdamW state of its flat piece of every parameter,
// core/common/flat_shard.h) has, instead of the optimizer files above, one
// file per rank, optimizer-rank-0000R-of-0000N.safetensors (the same tensor
// names, each moment the rank's piece, 1-D; a rank whose piece of a
// parameter is empty has none of its tensors; never split by
// max_shard_size), and optimizer_sharding.json, the description: the world
// size, the level, the layout ("flat") and the name and shape of every
// trainable parameter. LoadCheckpointFiles assembles the whole state from
// the rank files, whatever world reads it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/common/flat_shard.h"
#include "core/snapshot/safetensors.h"

namespace memprofd {
namespace snapshot {

inline constexpr char kOptimizerFilePrefix[] = "optimizer";
inline constexpr char kOptimizerSingleFileName[] = "optimizer.safetensors";
inline constexpr char kOptimizerIndexFileName[] = "optimizer.index.json";
inline constexpr char kTrainerStateFile[] = "trainer_state.json";
inline constexpr char kOptimizerShardingFile[] = "optimizer_sharding.json";

// How a sharded run's optimizer state is split over its ranks.
struct OptimizerShardingDescription {
  int world_size = 1;
  // The sharding level's name (core/dist/sharding.h: "optimizer").
  std::string level;
  // Each trainable parameter's name and shape, in model order.
  std::vector<std::pair<std::string, std::vector<int64_t>>> parameters;
};

// "optimizer-rank-0000R-of-0000N.safetensors": rank `rank`'s file among
// `world_size` ranks.
std::string RankOptimizerFileName(int rank, int world_size);
// optimizer_sharding.json's text, and its reader: DATA_LOSS naming `path`
// when the text is not the description (not JSON, a field missing or of the
// wrong type, a shape that is not a short list of sizes);
// FAILED_PRECONDITION for a description of another layout (an earlier
// version's, with whole parameters per rank).
std::string OptimizerShardingToJson(const OptimizerShardingDescription& description);
absl::StatusOr<OptimizerShardingDescription> OptimizerShardingFromJson(
    absl::string_view text, absl::string_view path);

// Writes one rank's optimizer state (`tensors`, live, any device) as
// RankOptimizerFileName(rank, world_size) in `dir`, with `metadata` in its
// header, atomically within `dir` (written as a hidden partial file, fsynced,
// then renamed), so that whoever sees the file sees it whole. Returns its
// size. WriteSafetensorsFile's errors; ALREADY_EXISTS when the file is there.
absl::StatusOr<int64_t> WriteRankOptimizerFile(
    const std::string& dir, int rank, int world_size, const TensorList& tensors,
    const std::map<std::string, std::string>& metadata, int64_t staging_bytes);

// What a checkpoint writes besides the weights.
struct CheckpointPayload {
  // Named optimizer tensors, live (streamed like the weights, never copied
  // whole); written in their own dtype whatever SnapshotOptions::dtype says.
  TensorList optimizer_tensors;
  // Added to the optimizer files' __metadata__ (with "format": "pt").
  std::map<std::string, std::string> optimizer_metadata;
  // trainer_state.json's text.
  std::string trainer_state_json;
  // Set when the optimizer state is sharded: optimizer_tensors are then rank
  // 0's alone, written as its rank file, and the other ranks' complete files
  // wait in `other_ranks_dir`, from which the writer moves them into the
  // checkpoint before it publishes it (FAILED_PRECONDITION naming the rank
  // whose file is not there).
  std::optional<OptimizerShardingDescription> sharding;
  std::string other_ranks_dir;
};

// A checkpoint's training state as read back.
struct LoadedCheckpoint {
  // Memory-mapped (copy-on-write) tensors of the optimizer files.
  TensorList optimizer_tensors;
  std::map<std::string, std::string> optimizer_metadata;
  std::string trainer_state_json;
  // Set when the checkpoint's optimizer state was written sharded; the
  // tensors above are then every rank's, assembled: each moment whole, or
  // with `pieces_of` only the flat piece (1-D) of that rank of that world
  // size (the step counts stay whole, one number each).
  std::optional<OptimizerShardingDescription> sharding;
  std::optional<FlatShardSpec> pieces_of;
};

// Reads the checkpoint files of `dir`. FAILED_PRECONDITION naming what is
// missing when `dir` has no trainer_state.json or no optimizer file (a
// weights-only snapshot or a plain Hugging Face directory); DATA_LOSS
// naming the file for a corrupt or truncated optimizer file or index, a
// shard the index names that is missing, or a tensor in two shards, and
// for a sharded checkpoint a rank file that is missing, a tensor the
// description does not name, or a piece missing or of the wrong size;
// INVALID_ARGUMENT for dtypes memprofd does not handle; with `roots`,
// PERMISSION_DENIED for a file that leads outside them (as
// LoadSafetensorsDirectory). Thread-safe.
//
// `pieces_for` (optional): the reader keeps the optimizer state of that
// flat piece only (a rank of a run with its optimizer state sharded), at
// whatever world size the checkpoint was written. A sharded checkpoint's
// moments are then assembled into this piece alone, from the byte ranges of
// the old ranks' files that overlap it, so no rank holds any moment whole
// (LoadedCheckpoint::pieces_of says so); an unsharded checkpoint's stay
// whole, mapped from the file, for Trainer::Restore to narrow.
absl::StatusOr<LoadedCheckpoint> LoadCheckpointFiles(
    const std::string& dir, const PathRoots* roots = nullptr,
    const FlatShardSpec* pieces_for = nullptr);

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_CHECKPOINT_FILES_H_

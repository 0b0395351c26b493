#ifndef MEMPROFD_CORE_TRAIN_TRAINER_STATE_H_
#define MEMPROFD_CORE_TRAIN_TRAINER_STATE_H_

// Where training stands, beyond the weights and the optimizer's moments: the
// global step, the run in progress (its merged options and how far it got),
// the data sampler's generator state and cursor, and the recent losses. A
// checkpoint stores it as trainer_state.json (snapshot::kTrainerStateFile); a resumed run
// continues from it bit for bit. Plain data, free of LibTorch (the generator state is
// kept as the bytes at::Generator::get_state() gives).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/train/train_options.h"

namespace memprofd {

// Bumped when trainer_state.json changes in a way older readers cannot read.
inline constexpr int kTrainerStateFormatVersion = 1;
// How many of the newest step losses a trainer keeps (and a checkpoint
// stores).
inline constexpr size_t kRecentLossesKept = 100;

// The data sampler of a run: the CPU generator that draws window starts
// (TokenDataset::NextBatch), seeded with the run's seed.
struct DataSamplerState {
  uint64_t seed = 0;
  // at::Generator::get_state() of the CPU generator (mt19937 state and the
  // normal-distribution caches), byte for byte.
  std::string generator_state;
  // The cursor: micro-batches and windows drawn so far in the run.
  int64_t batches_drawn = 0;
  int64_t windows_drawn = 0;
};

// The run that a resume continues: the last one started on this model.
struct RunState {
  // Its options, merged and validated. `steps` is the run's total: a
  // resumed run counts the steps done before the checkpoint too.
  TrainOptions options;
  int64_t steps_completed = 0;
  // Tokens in its data source when it started; a resume that reuses the
  // source checks it did not change.
  int64_t data_tokens = 0;
  DataSamplerState sampler;
};

struct TrainerState {
  // Optimizer steps over the trainer's life.
  int64_t global_step = 0;
  // Unset before the first training run.
  std::optional<RunState> run;
  // (global step, loss) of the newest steps, oldest first, at most
  // kRecentLossesKept.
  std::vector<std::pair<int64_t, double>> recent_losses;
  // A LoRA model's: the fingerprint of the frozen base its adapters trained
  // on (LlamaModel::BaseFingerprint), which a resume checks; empty for a
  // model without adapters (and in states written before).
  std::string lora_base_fingerprint;
};

// trainer_state.json's text (indent 2): the state plus the format version
// and memprofd's version. Every double is written as the shortest text that
// reads back to the same bits; the generator state as base64.
std::string TrainerStateToJson(const TrainerState& state);

// Parses trainer_state.json. DATA_LOSS naming `path` when the text is not
// JSON, a field is missing or has the wrong type, or the format version is
// not kTrainerStateFormatVersion. Unknown fields are ignored.
// Merged training options alone, as trainer_state.json's run.config holds
// them (the data source included): how rank 0 hands a Train to the other
// ranks of a data-parallel run. The reader's errors are INVALID_ARGUMENT.
std::string TrainOptionsToJson(const TrainOptions& options);
absl::StatusOr<TrainOptions> TrainOptionsFromJson(absl::string_view text);

absl::StatusOr<TrainerState> TrainerStateFromJson(absl::string_view text,
                                                  absl::string_view path);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_TRAINER_STATE_H_

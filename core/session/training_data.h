#ifndef MEMPROFD_CORE_SESSION_TRAINING_DATA_H_
#define MEMPROFD_CORE_SESSION_TRAINING_DATA_H_

// How the session reads the data a request names: on the owner thread (or a
// follower's), never on a gRPC thread; inside the operator's data roots;
// stopping when the operation is cancelled. For the session's .cc files only.

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "core/common/files.h"
#include "core/session/operation.h"
#include "core/session/session_types.h"
#include "core/train/data.h"
#include "core/train/train_options.h"

namespace memprofd {

struct TrainingData {
  std::shared_ptr<TokenDataset> data;
  std::shared_ptr<TokenDataset> eval_data;  // null without eval_data
};

// True for the sources read from a file (text and token files).
bool NamesFile(const DataSpec& spec);

// Client-named files confined to `roots`, at most options.max_data_file_bytes
// each, cancelled with `op` (none: never). `roots` must outlive the result.
DataAccess ClientDataAccess(const PathRoots& roots, const SessionOptions& options,
                            const std::shared_ptr<Operation>& op);

// train.data and train.eval_data read and checked for train.seq_len (an
// eval_data error says "eval_data: "). With `resumed_tokens`, the data must
// hold that many tokens (FAILED_PRECONDITION otherwise: the run to resume
// read another source). TokenDataset::Create's statuses otherwise.
absl::StatusOr<TrainingData> ReadTrainingData(const TrainOptions& train,
                                              int64_t vocab_size,
                                              std::optional<int64_t> resumed_tokens,
                                              const DataAccess& access);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_TRAINING_DATA_H_

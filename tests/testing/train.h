#ifndef MEMPROFD_TESTS_TESTING_TRAIN_H_
#define MEMPROFD_TESTS_TESTING_TRAIN_H_

// Training runs for tests and benchmarks that build TrainOptions by hand: checked for the
// trainer's model (Trainer::Check) and run. Header-only; the test links
// memprofd_train.

#include "absl/status/statusor.h"
#include "core/train/train_options.h"
#include "core/train/trainer.h"

namespace memprofd {
namespace testing {

// Trainer::Run of `options` once Trainer::Check accepts them; Check's
// INVALID_ARGUMENT otherwise.
inline absl::StatusOr<TrainResult> CheckAndRun(Trainer& trainer,
                                               const TrainOptions& options,
                                               const TrainRunRequest& request = {}) {
  absl::StatusOr<ValidTrainOptions> valid = trainer.Check(options);
  if (!valid.ok()) return valid.status();
  return trainer.Run(*valid, request);
}

}  // namespace testing
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_TESTING_TRAIN_H_

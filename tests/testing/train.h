#ifndef MEMPROFD_TESTS_TESTING_TRAIN_H_
#define MEMPROFD_TESTS_TESTING_TRAIN_H_

// Training runs for tests and benchmarks that build TrainOptions by hand: checked for the
// trainer's model (Trainer::Check) and run. Header-only; the test links
// memprofd_train.

#include <functional>
#include <utility>

#include "absl/status/statusor.h"
#include "core/train/train_options.h"
#include "core/train/trainer.h"

namespace memprofd {
namespace testing {

// A TrainRunRequest from its fields in order, the trailing ones left out as
// needed: what braces would build, without -Wextra's warning about the
// members they leave out.
inline TrainRunRequest Request(std::function<void(const StepReport&)> on_step,
                               std::function<bool()> cancelled = {},
                               StepListeners listeners = {},
                               const TokenDataset* data = nullptr,
                               const TokenDataset* eval_data = nullptr,
                               bool continue_last = false) {
  TrainRunRequest r;
  r.on_step = std::move(on_step);
  r.cancelled = std::move(cancelled);
  r.listeners = std::move(listeners);
  r.data = data;
  r.eval_data = eval_data;
  r.continue_last = continue_last;
  return r;
}

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

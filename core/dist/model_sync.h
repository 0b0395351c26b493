#ifndef MEMPROFD_CORE_DIST_MODEL_SYNC_H_
#define MEMPROFD_CORE_DIST_MODEL_SYNC_H_

// Keeping the ranks' replicas of one model equal: the check at start that
// every rank holds the same model, the copy of rank 0's parameters, and the
// checksum whose spread across ranks is the drift metric (0 while data
// parallel works). Collectives: every rank calls the same functions in the
// same order. Thread-safety: the owner thread, like ProcessGroup.

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/process_group.h"

namespace memprofd {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Checks that every rank has the same parameter names, shapes and dtypes (a
// fingerprint gathered from all), then overwrites each parameter with rank
// 0's. FAILED_PRECONDITION naming the first rank whose model differs from
// rank 0's, and what to fix; the collective's status when a rank fails.
absl::Status TakeRankZeroParameters(ProcessGroup& group, const NamedTensors& parameters);

// The same for the optimizer's state (Trainer::NamedOptimizerState: empty on
// every rank before the first step, the same tensors on every rank after a
// resume from one checkpoint). FAILED_PRECONDITION naming the first rank
// whose state differs from rank 0's (one resumed and another did not).
absl::Status TakeRankZeroOptimizerState(ProcessGroup& group, const NamedTensors& state);

// max - min over ranks of the sum of every parameter (in float64). 0 when the
// replicas agree bit for bit (the same sums of the same values in the same
// order), which is what data parallel keeps.
absl::StatusOr<double> ParameterDrift(ProcessGroup& group,
                                      const NamedTensors& parameters);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_MODEL_SYNC_H_

#ifndef MEMPROFD_CORE_TRAIN_LR_SCHEDULE_H_
#define MEMPROFD_CORE_TRAIN_LR_SCHEDULE_H_

// Learning-rate schedules under transformers' get_scheduler names, with the
// same formulas (transformers/optimization.py, the _get_*_lr_lambda
// functions), as a pure function of the step: a run that resumes at step k
// gets the learning rate of step k from the step alone. Plain functions, free
// of LibTorch; thread-safe.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

enum class LrSchedulerType {
  // transformers' "constant": the learning rate as given, every step.
  kConstant = 0,
  // "constant_with_warmup": linear from 0 over warmup_steps, then constant.
  kConstantWithWarmup = 1,
  // "linear": warmup, then linear down to 0 at the last step.
  kLinear = 2,
  // "cosine": warmup, then half a cosine down to 0.
  kCosine = 3,
  // "cosine_with_min_lr": warmup, then half a cosine down to
  // min_lr_ratio * learning_rate.
  kCosineWithMinLr = 4,
};

// The names, as transformers spells them ("constant", "constant_with_warmup",
// "linear", "cosine", "cosine_with_min_lr").
absl::string_view LrSchedulerTypeName(LrSchedulerType type);
// INVALID_ARGUMENT naming the valid names for any other name.
absl::StatusOr<LrSchedulerType> ParseLrSchedulerType(absl::string_view name);
// "constant, constant_with_warmup, linear, cosine, cosine_with_min_lr".
std::string LrSchedulerTypeNames();

struct LrSchedule {
  LrSchedulerType type = LrSchedulerType::kConstant;
  int64_t warmup_steps = 0;
  // cosine_with_min_lr's floor, as a fraction of the peak (transformers'
  // min_lr_rate).
  double min_lr_ratio = 0.0;
};

// OK, or INVALID_ARGUMENT: warmup_steps < 0 or > total_steps; warmup with the
// plain "constant" schedule (which has none: use constant_with_warmup);
// min_lr_ratio outside [0, 1], or set (non-zero) with a schedule other than
// cosine_with_min_lr.
absl::Status ValidateLrSchedule(const LrSchedule& schedule, int64_t total_steps);

// The factor on the peak learning rate for the optimizer step that follows
// `completed_steps` steps of a run of `total_steps` (transformers' lr_lambda
// of current_step = completed_steps: the first step has factor 0 when there
// is warmup, as with transformers' Trainer).
double LrFactor(const LrSchedule& schedule, int64_t completed_steps, int64_t total_steps);

// peak * LrFactor(...), computed as torch's LambdaLR does (base_lr * factor).
double LearningRateAt(const LrSchedule& schedule, double peak, int64_t completed_steps,
                      int64_t total_steps);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_LR_SCHEDULE_H_

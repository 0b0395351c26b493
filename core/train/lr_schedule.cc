#include "core/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/utf8.h"

namespace memprofd {
namespace {

constexpr LrSchedulerType kTypes[] = {LrSchedulerType::kConstant,
                                      LrSchedulerType::kConstantWithWarmup,
                                      LrSchedulerType::kLinear, LrSchedulerType::kCosine,
                                      LrSchedulerType::kCosineWithMinLr};

// transformers' warmup: float(current_step) / float(max(1, num_warmup_steps)).
double Warmup(int64_t step, int64_t warmup) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
}

// transformers' _get_cosine_schedule_with_warmup_lr_lambda with num_cycles
// 0.5 (get_scheduler's default) and min_lr_rate (0 for plain "cosine").
double Cosine(int64_t step, int64_t warmup, int64_t total, double min_lr_rate) {
  const double progress = static_cast<double>(step - warmup) /
                          static_cast<double>(std::max<int64_t>(1, total - warmup));
  double factor = 0.5 * (1.0 + std::cos(M_PI * 0.5 * 2.0 * progress));
  factor = factor * (1 - min_lr_rate) + min_lr_rate;
  return std::max(0.0, factor);
}

}  // namespace

absl::string_view LrSchedulerTypeName(LrSchedulerType type) {
  switch (type) {
    case LrSchedulerType::kConstant:
      return "constant";
    case LrSchedulerType::kConstantWithWarmup:
      return "constant_with_warmup";
    case LrSchedulerType::kLinear:
      return "linear";
    case LrSchedulerType::kCosine:
      return "cosine";
    case LrSchedulerType::kCosineWithMinLr:
      return "cosine_with_min_lr";
  }
  return "unknown";
}

std::string LrSchedulerTypeNames() {
  return absl::StrJoin(kTypes, ", ", [](std::string* out, LrSchedulerType t) {
    absl::StrAppend(out, LrSchedulerTypeName(t));
  });
}

absl::StatusOr<LrSchedulerType> ParseLrSchedulerType(absl::string_view name) {
  for (LrSchedulerType t : kTypes) {
    if (name == LrSchedulerTypeName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat("lr_scheduler_type: unknown schedule ",
                                                 Echo(name), "; use one of ",
                                                 LrSchedulerTypeNames()));
}

absl::Status ValidateLrSchedule(const LrSchedule& s, int64_t total_steps) {
  if (s.warmup_steps < 0 || s.warmup_steps > total_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_steps must be in [0, steps] = [0, ", total_steps, "], got ",
                     s.warmup_steps));
  }
  if (s.type == LrSchedulerType::kConstant && s.warmup_steps > 0) {
    return absl::InvalidArgumentError(
        "warmup_steps: the 'constant' schedule has no warmup; use "
        "lr_scheduler_type constant_with_warmup (or linear, cosine, "
        "cosine_with_min_lr)");
  }
  if (!(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_lr_ratio must be in [0, 1], got ", s.min_lr_ratio));
  }
  if (s.min_lr_ratio != 0 && s.type != LrSchedulerType::kCosineWithMinLr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "min_lr_ratio applies to lr_scheduler_type cosine_with_min_lr only, not '",
        LrSchedulerTypeName(s.type), "'"));
  }
  return absl::OkStatus();
}

double LrFactor(const LrSchedule& s, int64_t step, int64_t total) {
  const int64_t warmup = s.warmup_steps;
  switch (s.type) {
    case LrSchedulerType::kConstant:
      return 1.0;
    case LrSchedulerType::kConstantWithWarmup:
      return step < warmup ? Warmup(step, warmup) : 1.0;
    case LrSchedulerType::kLinear:
      if (step < warmup) return Warmup(step, warmup);
      return std::max(0.0, static_cast<double>(total - step) /
                               static_cast<double>(std::max<int64_t>(1, total - warmup)));
    case LrSchedulerType::kCosine:
      return step < warmup ? Warmup(step, warmup) : Cosine(step, warmup, total, 0.0);
    case LrSchedulerType::kCosineWithMinLr:
      return step < warmup ? Warmup(step, warmup)
                           : Cosine(step, warmup, total, s.min_lr_ratio);
  }
  return 1.0;
}

double LearningRateAt(const LrSchedule& s, double peak, int64_t completed_steps,
                      int64_t total_steps) {
  return peak * LrFactor(s, completed_steps, total_steps);
}

}  // namespace memprofd

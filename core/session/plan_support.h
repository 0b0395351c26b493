#ifndef MEMPROFD_CORE_SESSION_PLAN_SUPPORT_H_
#define MEMPROFD_CORE_SESSION_PLAN_SUPPORT_H_

// What the plan thread's two kinds of work share: PlanMemory operations
// (session_plan.cc) and a training's admission (training.cc). For the
// session's .cc files only.

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/common/torch_boundary.h"
#include "core/plan/planner.h"
#include "core/session/operation.h"
#include "core/train/data.h"
#include "core/train/train_options.h"

namespace memprofd {

// The device a plan targets when the request names none: the session's
// (a device string such as "cpu" or "cuda:0").
inline plan::PlanSpec::Target TargetOf(absl::string_view device) {
  return absl::StartsWith(device, "cuda") ? plan::PlanSpec::Target::kCuda
                                          : plan::PlanSpec::Target::kCpu;
}

// What a run of `train` keeps of its data in the allocator
// (plan::PlanSpec::data_bytes): its training and evaluation tokens held in
// memory.
inline int64_t PlannedDataBytes(const TrainOptions& train) {
  return InMemoryTokenBytes(train.data) +
         (train.eval_data ? InMemoryTokenBytes(*train.eval_data) : 0);
}

// fn() on the plan thread, where the planner runs LibTorch: nothing it
// throws may end the thread (and the daemon) instead of the operation, so a
// throw comes back as TorchBoundary's status, named `what`.
template <typename T>
absl::StatusOr<T> PlanGuarded(absl::string_view what,
                              absl::FunctionRef<absl::StatusOr<T>()> fn) {
  absl::StatusOr<T> out = absl::InternalError(absl::StrCat(what, " did not run"));
  if (absl::Status thrown = TorchBoundary(what, [&] { out = fn(); }); !thrown.ok()) {
    out = thrown;
  }
  return out;
}

// When a plan stops (PlanSpec::cancelled): its operation was cancelled (by
// its client, or a drain), or it ran past the daemon's wall-clock cap on a
// plan (SessionOptions::max_plan_time), counted from when it starts.
class PlanClock {
 public:
  PlanClock(std::shared_ptr<Operation> op, absl::Duration cap)
      : op_(std::move(op)), cap_(cap), deadline_(absl::Now() + cap) {}

  std::function<bool()> StopWhen() const {
    return [op = op_, deadline = deadline_] {
      return op->cancel_requested() || absl::Now() >= deadline;
    };
  }

  // A plan's failure as its client reads it: one the cap stopped (the
  // planner says CANCELLED) is DEADLINE_EXCEEDED naming the cap.
  absl::Status Explain(absl::Status status, absl::string_view what) const {
    if (!absl::IsCancelled(status) || op_->cancel_requested() ||
        absl::Now() < deadline_) {
      return status;
    }
    return absl::DeadlineExceededError(absl::StrCat(
        what, " ran past the daemon's cap on a plan (max_plan_time, ",
        absl::FormatDuration(cap_),
        ") and was stopped: plan a smaller model or configuration, or raise the cap"));
  }

 private:
  const std::shared_ptr<Operation> op_;
  const absl::Duration cap_;
  const absl::Time deadline_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_PLAN_SUPPORT_H_

// RankCoordinator's step boundaries (rank_coordinator.h): every rank meets at
// each one in one small all-reduce; when rank 0 has work there (a snapshot,
// an evaluation, a checkpoint) the followers follow its events: write their
// optimizer shards, stream their parameters or the units of an evaluation.

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "core/common/log.h"
#include "core/common/status_macros.h"
#include "core/dist/parameter_sharding.h"
#include "core/dist/process_group.h"
#include "core/session/rank_coordinator.h"
#include "core/session/rank_messages.h"
#include "core/snapshot/writer.h"

namespace memprofd {

using rank_messages::BadCommand;
using rank_messages::BoundaryEventKey;
using rank_messages::IntField;
using rank_messages::kBoundaryWorkTimeout;
using rank_messages::ShardAnswerKey;
using rank_messages::StatusFromJson;
using rank_messages::StatusToJson;
using rank_messages::StringField;

absl::StatusOr<bool> RankCoordinator::SyncStepBoundary(bool cancel_requested,
                                                       ParameterSharding* sharded) {
  const bool leader = !follower();
  // [any rank cancelled, rank 0 has boundary work]
  at::Tensor flags = at::tensor({int64_t{cancel_requested ? 1 : 0},
                                 int64_t{leader && boundary_work_->HasBoundaryWork()}},
                                at::kLong);
  RETURN_IF_ERROR(group_->AllReduceSum(flags));
  const int64_t boundary = boundaries_++;
  if (flags[1].item<int64_t>() > 0) {
    sharded_ = sharded;
    absl::Cleanup forget = [this] { sharded_ = nullptr; };
    if (!leader) {
      RETURN_IF_ERROR(FollowBoundary(boundary));
      return flags[0].item<int64_t>() > 0;
    }
    current_boundary_ = boundary;
    boundary_events_ = 0;
    boundary_failure_ = absl::OkStatus();
    boundary_work_->RunBoundaryWork();
    current_boundary_ = -1;
    const absl::Status failure = boundary_failure_;
    Json end = {{"kind", "done"}};
    if (!failure.ok()) {
      end = StatusToJson(failure);
      end["kind"] = "failed";
    }
    RETURN_IF_ERROR(
        group_->SetKey(BoundaryEventKey(boundary, boundary_events_++), DumpJson(end)));
    RETURN_IF_ERROR(failure);
  }
  return flags[0].item<int64_t>() > 0;
}

absl::Status RankCoordinator::PublishBoundaryEvent(const std::string& event) {
  absl::Status published =
      group_->SetKey(BoundaryEventKey(current_boundary_, boundary_events_++), event);
  FailBoundary(published);
  return published;
}

void RankCoordinator::FailBoundary(const absl::Status& status) {
  if (!status.ok() && current_boundary_ >= 0 && boundary_failure_.ok()) {
    boundary_failure_ = status;
  }
}

// Rank 0's side of the parameter stream, for the snapshot writer: each
// weight it acquires is broadcast from its owner (ParameterSharding's
// stream) while the followers join in FollowBoundary; destroying it ends
// the stream. After a failed collective nothing more is sent (the run is
// broken, and the boundary fails with it).
class BoundaryParameterStream : public snapshot::TensorAccess {
 public:
  BoundaryParameterStream(RankCoordinator* ranks, ParameterSharding* sharded,
                          std::vector<std::optional<size_t>> index_of)
      : ranks_(ranks), sharded_(sharded), index_of_(std::move(index_of)) {}
  ~BoundaryParameterStream() override {
    if (!broken_) ranks_->FailStream(sharded_->EndStream());
  }

  absl::StatusOr<int64_t> Acquire(size_t index) override {
    if (broken_) {
      return absl::AbortedError("the parameter stream broke at an earlier parameter");
    }
    if (index >= index_of_.size() || !index_of_[index]) return 0;  // not a parameter
    absl::StatusOr<int64_t> bytes = sharded_->StreamParameter(*index_of_[index]);
    if (!bytes.ok()) {
      broken_ = true;
      ranks_->FailStream(bytes.status());
    }
    return bytes;
  }
  void Release(size_t index) override {
    if (index < index_of_.size() && index_of_[index]) {
      sharded_->ReleaseParameter(*index_of_[index]);
    }
  }

 private:
  RankCoordinator* const ranks_;
  ParameterSharding* const sharded_;
  const std::vector<std::optional<size_t>> index_of_;
  bool broken_ = false;
};

absl::StatusOr<std::unique_ptr<snapshot::TensorAccess>> RankCoordinator::StreamParameters(
    const std::vector<std::pair<std::string, at::Tensor>>& weights) {
  ParameterSharding* const sharded = ShardedNow();
  if (sharded == nullptr) return nullptr;
  std::vector<std::optional<size_t>> index_of;
  for (const auto& [name, tensor] : weights) index_of.push_back(sharded->IndexOf(tensor));
  RETURN_IF_ERROR(PublishStream("parameters"));
  return std::make_unique<BoundaryParameterStream>(this, sharded, std::move(index_of));
}

absl::Status RankCoordinator::PublishStream(const std::string& kind) {
  const std::string event = DumpJson(Json{{"kind", kind}});
  return current_boundary_ >= 0 ? PublishBoundaryEvent(event) : PublishCommand(event);
}

void RankCoordinator::FailStream(const absl::Status& status) {
  if (status.ok()) return;
  if (current_boundary_ >= 0) {
    FailBoundary(status);
  } else {
    // Between runs the other ranks are left in a collective that will not
    // complete, as after a failed step.
    FailRun(status);
  }
}

absl::Status RankCoordinator::FollowStream(ParameterSharding* sharded,
                                           const std::string& kind) {
  return kind == "parameters" ? sharded->FollowStream() : sharded->FollowUnitStream();
}

// Rank 0's side of the unit stream, for an evaluation at a step boundary:
// each unit is announced to the followers (FollowBoundary) and gathered with
// them; a failed collective, and the stream's end, fail the boundary.
class BoundaryEvaluation : public ShardedEvaluation {
 public:
  BoundaryEvaluation(RankCoordinator* ranks, ParameterSharding* sharded)
      : ShardedEvaluation(sharded, /*lead=*/true), ranks_(ranks) {}
  ~BoundaryEvaluation() override { ranks_->FailStream(Finish()); }

  absl::Status Enter(const ModelUnit& unit) override {
    absl::Status entered = ShardedEvaluation::Enter(unit);
    ranks_->FailStream(entered);
    return entered;
  }

 private:
  RankCoordinator* const ranks_;
};

absl::StatusOr<std::unique_ptr<EvalUnits>> RankCoordinator::EvaluationUnits() {
  ParameterSharding* const sharded = ShardedNow();
  if (sharded == nullptr) return nullptr;
  RETURN_IF_ERROR(PublishStream("units"));
  return std::make_unique<BoundaryEvaluation>(this, sharded);
}

absl::Status RankCoordinator::FollowBoundary(int64_t boundary) {
  for (int64_t k = 0;; ++k) {
    absl::StatusOr<std::string> event =
        group_->WaitKey(BoundaryEventKey(boundary, k), kBoundaryWorkTimeout);
    if (!event.ok()) {
      return absl::Status(event.status().code(),
                          absl::StrCat("waiting for rank 0's snapshot or evaluation at "
                                       "a step boundary: ",
                                       event.status().message()));
    }
    ASSIGN_OR_RETURN(const Json v, ParseJson(*event));
    const std::string kind = StringField(v, "kind");
    if (kind == "done") return absl::OkStatus();
    if (kind == "failed") {
      const absl::Status failure = StatusFromJson(v);
      return absl::Status(
          failure.code(),
          absl::StrCat("rank 0's work at a step boundary failed: ", failure.message()));
    }
    if (kind == "optimizer_shard") {
      RETURN_IF_ERROR(
          AnswerOptimizerShard(StringField(v, "dir"), IntField(v, "id").value_or(-1)));
      continue;
    }
    // The events of a fully sharded run: rank 0 publishes them only when its
    // SyncStepBoundary was given the sharded parameters, as every rank's was.
    const bool model_event = kind == "parameters" || kind == "units";
    if (!model_event) {
      return BadCommand(absl::StrCat("unknown step-boundary event '", kind, "'"));
    }
    if (sharded_ == nullptr) {
      return absl::InternalError(absl::StrCat(
          "rank 0 sent the step-boundary event '", kind,
          "' of a fully sharded run, but this rank's parameters are not sharded"));
    }
    RETURN_IF_ERROR(FollowStream(sharded_, kind));
  }
}

absl::Status RankCoordinator::AnswerOptimizerShard(const std::string& dir, int64_t id) {
  absl::Status written = boundary_work_->WriteOptimizerShard(dir);
  if (!written.ok()) {
    LogError(
        absl::StrCat("rank ", world_.rank,
                     ": writing this rank's optimizer state for rank 0's checkpoint: ",
                     written.ToString()));
  }
  return group_->SetKey(ShardAnswerKey(id, world_.rank), DumpJson(StatusToJson(written)));
}

absl::Status RankCoordinator::GatherOptimizerShards(const std::string& dir) {
  if (group_ == nullptr || world_.world_size < 2) return absl::OkStatus();
  const int64_t id = gathers_++;
  const Json ask = {{"kind", "optimizer_shard"}, {"dir", dir}, {"id", id}};
  const bool at_boundary = current_boundary_ >= 0;
  RETURN_IF_ERROR(at_boundary ? group_->SetKey(BoundaryEventKey(current_boundary_,
                                                                boundary_events_++),
                                               DumpJson(ask))
                              : PublishCommand(DumpJson(ask)));
  absl::Status status;
  const absl::Time deadline = absl::Now() + collective_timeout_;
  for (int r = 1; r < world_.world_size && status.ok(); ++r) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
    absl::StatusOr<std::string> answer = group_->WaitKey(ShardAnswerKey(id, r), left);
    if (!answer.ok()) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "rank ", r, " did not write its optimizer state for the checkpoint within ",
          absl::FormatDuration(collective_timeout_),
          " (the collective timeout): it died "
          "or hangs; ",
          answer.status().message()));
      break;
    }
    absl::StatusOr<Json> v = ParseJson(*answer);
    const absl::Status theirs =
        v.ok() ? StatusFromJson(*v) : absl::InternalError("an unreadable answer");
    if (!theirs.ok()) {
      // A follower's bad argument is no bad argument of the caller's.
      status = absl::Status(
          absl::IsInvalidArgument(theirs) ? absl::StatusCode::kInternal : theirs.code(),
          absl::StrCat("rank ", r,
                       " could not write its optimizer state for the "
                       "checkpoint: ",
                       theirs.message()));
    }
  }
  if (!status.ok() && at_boundary && boundary_failure_.ok()) boundary_failure_ = status;
  return status;
}

}  // namespace memprofd

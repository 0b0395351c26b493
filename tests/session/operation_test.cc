#include "core/session/operation.h"

#include <atomic>
#include <string>
#include <thread>
#include <variant>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "core/common/utf8.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

TEST(OperationTest, LifecycleSucceedsWithResult) {
  OperationRegistry registry;
  auto op = registry.Create(OperationKind::kTrain);
  EXPECT_EQ(op->id(), "op-1");
  EXPECT_EQ(op->View().state, OperationState::kQueued);
  op->MarkRunning();
  op->SetProgress(3, 10, "steps", "step 3/10");
  OperationView v = op->View();
  EXPECT_EQ(v.state, OperationState::kRunning);
  EXPECT_EQ(v.completed, 3);
  EXPECT_FALSE(v.done);
  TrainResult result;
  result.steps_completed = 10;
  op->Finish(absl::OkStatus(), result);
  v = op->View();
  EXPECT_TRUE(v.done);
  EXPECT_EQ(v.state, OperationState::kSucceeded);
  ASSERT_TRUE(std::holds_alternative<TrainResult>(v.result));
  EXPECT_EQ(std::get<TrainResult>(v.result).steps_completed, 10);
  // A second Finish changes nothing.
  op->Finish(absl::InternalError("late"));
  EXPECT_EQ(op->View().state, OperationState::kSucceeded);
}

TEST(OperationTest, FailureAndCancellationKeepTheirStatus) {
  OperationRegistry registry;
  auto failed = registry.Create(OperationKind::kSnapshot);
  SnapshotResult partial;
  partial.manifest.name = "x";
  failed->Finish(absl::ResourceExhaustedError("disk full"), partial);
  EXPECT_EQ(failed->View().state, OperationState::kFailed);
  EXPECT_EQ(failed->View().error.code(), absl::StatusCode::kResourceExhausted);
  // A failure keeps no result.
  EXPECT_TRUE(std::holds_alternative<std::monostate>(failed->View().result));

  auto cancelled = registry.Create(OperationKind::kTrain);
  cancelled->RequestCancel();
  EXPECT_TRUE(cancelled->cancel_requested());
  TrainResult ran;
  ran.steps_completed = 5;
  cancelled->Finish(absl::CancelledError("cancelled"), ran);
  EXPECT_EQ(cancelled->View().state, OperationState::kCancelled);
  // Cancellation keeps what did run.
  EXPECT_EQ(std::get<TrainResult>(cancelled->View().result).steps_completed, 5);
}

TEST(OperationTest, HugeMessagesAreCutAndKeepTheirCodeAndPayloads) {
  OperationRegistry registry;
  auto op = registry.Create(OperationKind::kLoadModel);
  // A message built around a client's 15 MiB value (a config.json's
  // model_type), with a multi-byte character where the cut falls.
  std::string huge = "config.json field \"model_type\" is \"";
  while (huge.size() < kMaxOperationMessageBytes - 1) huge += "a";
  huge += "\xc3\xa9";  // U+00E9 straddles the cut
  huge.append(size_t{15} << 20, 'b');
  absl::Status status = absl::InvalidArgumentError(huge);
  status.SetPayload("memprofd.option", absl::Cord("data_roots"));
  op->SetProgress(0, 1, "steps", huge);
  EXPECT_LE(op->View().message.size(), kMaxOperationMessageBytes + 64);
  op->Finish(status);
  const absl::Status kept = op->View().error;
  EXPECT_EQ(kept.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LE(kept.message().size(), kMaxOperationMessageBytes + 64);
  EXPECT_NE(kept.message().find("model_type"), absl::string_view::npos);
  EXPECT_NE(kept.message().find(absl::StrCat(huge.size(), " bytes in all")),
            absl::string_view::npos);
  EXPECT_TRUE(IsValidUtf8(kept.message()));
  EXPECT_EQ(kept.GetPayload("memprofd.option"), absl::Cord("data_roots"));
  // A short message is kept as it is.
  auto small = registry.Create(OperationKind::kLoadModel);
  small->Finish(absl::NotFoundError("no model directory '/x'"));
  EXPECT_EQ(small->View().error.message(), "no model directory '/x'");
}

// The drain is not a cancel: work that stops for it with CANCELLED (or its
// own ABORTED) ends FAILED with ABORTED and reason DRAINING, keeping what
// ran; whichever request came first decides.
TEST(OperationTest, DrainEndsAbortedWithItsReasonAndACancelStaysCancelled) {
  OperationRegistry registry;
  auto drained = registry.Create(OperationKind::kTrain);
  drained->RequestDrain();
  drained->RequestCancel();  // too late to change how it ends
  EXPECT_TRUE(drained->cancel_requested());
  EXPECT_TRUE(drained->drain_requested());
  TrainResult ran;
  ran.steps_completed = 5;
  drained->Finish(absl::CancelledError("cancelled after 5 of 10 steps"), ran);
  OperationView v = drained->View();
  EXPECT_EQ(v.state, OperationState::kFailed);
  EXPECT_EQ(v.error.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(
      v.error.message(),
      "memprofd is shutting down and stopped this operation (cancelled after 5 of 10 "
      "steps); run it again once memprofd serves");
  EXPECT_EQ(v.reason, kDrainingReason);
  EXPECT_EQ(std::get<TrainResult>(v.result).steps_completed, 5);

  auto own_message = registry.Create(OperationKind::kTrain);
  own_message->RequestDrain();
  own_message->Finish(absl::AbortedError("stopped at step 3"), ran);
  EXPECT_EQ(own_message->View().error.message(), "stopped at step 3");
  EXPECT_EQ(own_message->View().reason, kDrainingReason);

  auto cancelled = registry.Create(OperationKind::kTrain);
  cancelled->RequestCancel();
  cancelled->RequestDrain();
  EXPECT_FALSE(cancelled->drain_requested());
  cancelled->Finish(absl::CancelledError("cancelled"), ran);
  EXPECT_EQ(cancelled->View().state, OperationState::kCancelled);
  EXPECT_EQ(cancelled->View().reason, "");

  // A failure of its own while draining is that failure.
  auto failed = registry.Create(OperationKind::kEvaluate);
  failed->RequestDrain();
  failed->Finish(absl::ResourceExhaustedError("out of memory"));
  EXPECT_EQ(failed->View().error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(failed->View().reason, "");
}

// Every client operation is either refused or listed by StopAdmitting (and
// so stopped by the drain); the daemon's own are still made.
TEST(OperationTest, StopAdmittingRefusesClientsAndListsWhatIsActive) {
  OperationRegistry registry;
  auto done = registry.Create(OperationKind::kSnapshot);
  done->Finish(absl::OkStatus());
  absl::StatusOr<std::shared_ptr<Operation>> running =
      registry.Admit(OperationKind::kTrain);
  ASSERT_TRUE(running.ok());
  EXPECT_TRUE(registry.admitting());
  const auto active = registry.StopAdmitting();
  ASSERT_EQ(active.size(), 1u);
  EXPECT_EQ(active[0], *running);
  EXPECT_FALSE(registry.admitting());
  absl::StatusOr<std::shared_ptr<Operation>> refused =
      registry.Admit(OperationKind::kPlan);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(
      refused.status().message(),
      "memprofd is shutting down; retry against another instance, or once it is back");
  EXPECT_EQ(registry.Create(OperationKind::kSnapshot)->id(), "op-3");
  EXPECT_EQ(registry.StopAdmitting().size(), 2u);  // idempotent
}

TEST(OperationTest, RegistryFindsListsAndPrunesFinished) {
  OperationRegistry registry(/*max_finished=*/2);
  auto a = registry.Create(OperationKind::kTrain);
  auto b = registry.Create(OperationKind::kSnapshot);
  auto c = registry.Create(OperationKind::kTrain);
  EXPECT_EQ(registry.ActiveCount(), 3);
  ASSERT_TRUE(registry.Get("op-2").ok());
  EXPECT_EQ(registry.Get("op-99").status().code(), absl::StatusCode::kNotFound);
  OperationKind train = OperationKind::kTrain;
  auto trains = registry.List(&train, false);
  ASSERT_EQ(trains.size(), 2u);
  EXPECT_EQ(trains[0]->id(), "op-3");  // newest first

  a->Finish(absl::OkStatus());
  b->Finish(absl::OkStatus());
  c->Finish(absl::OkStatus());
  registry.Create(OperationKind::kTrain);  // prunes the oldest finished
  EXPECT_FALSE(registry.Get("op-1").ok());
  EXPECT_TRUE(registry.Get("op-3").ok());
  EXPECT_EQ(registry.List(nullptr, /*active_only=*/true).size(), 1u);
}

TEST(OperationTest, EventsAreBoundedAndNumbered) {
  Operation op("op-1", OperationKind::kTrain, /*max_events=*/3);
  for (int i = 1; i <= 5; ++i) {
    SessionStepReport report;
    report.step.step = i;
    op.AppendEvent(report);
  }
  EXPECT_EQ(op.events_total(), 5);
  int64_t first = 0;
  auto events = op.EventsFrom(1, 100, &first);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(first, 3);
  EXPECT_EQ(events[0].step.step, 3);
  events = op.EventsFrom(5, 100, &first);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(first, 5);
  EXPECT_TRUE(op.EventsFrom(6, 100, &first).empty());
  EXPECT_EQ(first, 0);
}

TEST(OperationTest, WaitersAndSubscribersSeeChangesFromAnotherThread) {
  Operation op("op-1", OperationKind::kTrain, 10);
  std::atomic<int> notified{0};
  int token = op.Subscribe([&] { notified++; });
  uint64_t seen = op.View().version;
  std::thread worker([&] {
    op.MarkRunning();
    op.Finish(absl::OkStatus());
  });
  OperationView v = op.WaitForChange(seen, absl::Now() + absl::Seconds(10));
  EXPECT_GT(v.version, seen);
  worker.join();
  EXPECT_EQ(notified.load(), 2);
  op.Unsubscribe(token);
  op.SetProgress(1, 1, "steps", "");
  EXPECT_EQ(notified.load(), 2);
  // Done: returns at once even with an old version and a far deadline.
  EXPECT_TRUE(op.WaitForChange(0, absl::InfiniteFuture()).done);
}

}  // namespace
}  // namespace memprofd

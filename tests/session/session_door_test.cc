// The rules of the one door (core/session/session_operations.cc and
// session_memory.cc, and the merges of StartTraining), tested on the Session
// itself: they are decided there, once, so every client sees the same
// answers.

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "core/session/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/operation.h"
#include "tests/testing/session.h"

namespace memprofd {
namespace {

using ::memprofd::testing::CpuSession;
using ::memprofd::testing::WaitDone;
using ::testing::HasSubstr;

// Keeps what it is told, for the test to read.
class RecordingObserver : public SessionObserver {
 public:
  void OnStep(const SessionStepReport& report) override {
    absl::MutexLock lock(&mu_);
    steps_.push_back(report.step.step);
    step_seconds_.push_back(report.step.step_seconds);
  }
  void OnSnapshotPublished(const snapshot::SnapshotManifest&) override {}
  std::vector<int64_t> steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  std::vector<double> step_seconds() const {
    absl::MutexLock lock(&mu_);
    return step_seconds_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int64_t> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<double> step_seconds_ ABSL_GUARDED_BY(mu_);
};

TEST(SessionDoorTest, WaitTimeoutsAreBoundedAndNeverNegative) {
  EXPECT_EQ(*Session::OperationWaitTimeout(std::nullopt), Session::kMaxOperationWait);
  EXPECT_EQ(*Session::OperationWaitTimeout(absl::ZeroDuration()),
            Session::kMaxOperationWait);
  EXPECT_EQ(*Session::OperationWaitTimeout(absl::Milliseconds(250)),
            absl::Milliseconds(250));
  EXPECT_EQ(*Session::OperationWaitTimeout(absl::Hours(1)), Session::kMaxOperationWait);
  absl::StatusOr<absl::Duration> negative =
      Session::OperationWaitTimeout(absl::Milliseconds(-1));
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.status().message(), HasSubstr("must be >= 0"));
}

TEST(SessionDoorTest, WithoutAModelDescribeAndTrainSayLoadFirst) {
  std::unique_ptr<Session> session = CpuSession("");
  ASSERT_NE(session, nullptr);
  EXPECT_EQ(session->DescribeModel().status().code(),
            absl::StatusCode::kFailedPrecondition);
  TrainSpec spec;
  spec.train.steps = 1;
  absl::StatusOr<std::shared_ptr<Operation>> op = session->StartTraining(spec);
  EXPECT_EQ(op.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(op.status().message(), HasSubstr("LoadModel"));
}

class TinyDoorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    session_ = CpuSession("tiny");
    ASSERT_NE(session_, nullptr);
  }
  std::unique_ptr<Session> session_;
};

TEST_F(TinyDoorTest, StepReportsComeOnlyFromTrainingOperations) {
  LoadModelSpec load;
  load.preset = "tiny";
  absl::StatusOr<std::shared_ptr<Operation>> loaded = session_->LoadModel(load);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const OperationView view = WaitDone(**loaded);
  ASSERT_EQ(view.state, OperationState::kSucceeded) << view.error;
  EXPECT_EQ(std::get<ModelSummary>(view.result).source, "preset:tiny");

  absl::StatusOr<std::shared_ptr<Operation>> not_train =
      session_->GetTrainingOperation((*loaded)->id());
  EXPECT_EQ(not_train.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_train.status().message(), HasSubstr("load_model operation"));
  EXPECT_EQ(session_->GetTrainingOperation("op-999").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(TinyDoorTest, UnsetTrainingFieldsTakeTheDefaultsAndSetOnesAreChecked) {
  TrainSpec spec;
  EXPECT_THAT(session_->StartTraining(spec).status().message(), HasSubstr("steps"));
  spec.train.steps = 1;
  spec.train.batch_size = 0;  // set, so not "the default": refused
  EXPECT_THAT(session_->StartTraining(spec).status().message(), HasSubstr("batch_size"));
  spec.train.batch_size = std::nullopt;
  spec.train.seq_len = 16;
  absl::StatusOr<std::shared_ptr<Operation>> op = session_->StartTraining(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  const OperationView v = WaitDone(**op);
  ASSERT_EQ(v.state, OperationState::kSucceeded) << v.error;
  // batch_size unset: TrainOptions' 8.
  EXPECT_EQ(std::get<TrainResult>(v.result).tokens, TrainOptions().batch_size * 16);
}

TEST_F(TinyDoorTest, ObserversHearOfEveryStep) {
  auto observer = std::make_shared<RecordingObserver>();
  session_->AddObserver(observer);
  TrainSpec spec;
  spec.train.steps = 3;
  spec.train.batch_size = 1;
  spec.train.seq_len = 16;
  absl::StatusOr<std::shared_ptr<Operation>> op = session_->StartTraining(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_EQ(WaitDone(**op).state, OperationState::kSucceeded);
  EXPECT_EQ(observer->steps(), (std::vector<int64_t>{1, 2, 3}));
  for (double seconds : observer->step_seconds()) EXPECT_GT(seconds, 0);
}

}  // namespace
}  // namespace memprofd

#include "core/common/phase.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

class RecordingListener : public PhaseListener {
 public:
  void OnStepBegin(int64_t step) override { log.push_back(absl::StrCat("begin ", step)); }
  void OnStepEnd(int64_t step) override { log.push_back(absl::StrCat("end ", step)); }
  void OnPhase(Phase phase) override { log.push_back(std::string(PhaseName(phase))); }
  std::vector<std::string> log;
};

TEST(PhaseTest, ScopesNestAndNotifyTheListener) {
  RecordingListener listener;
  SetPhaseListener(&listener);
  BeginStep(7);
  EXPECT_EQ(CurrentStep(), 7);
  {
    PhaseScope forward(Phase::kForward);
    EXPECT_EQ(CurrentPhase(), Phase::kForward);
    {
      PhaseScope backward(Phase::kBackward);
      EXPECT_EQ(CurrentPhase(), Phase::kBackward);
    }
    EXPECT_EQ(CurrentPhase(), Phase::kForward);
  }
  EndStep(7);
  SetPhaseListener(nullptr);
  EXPECT_EQ(CurrentPhase(), Phase::kIdle);
  EXPECT_EQ(listener.log, (std::vector<std::string>{"begin 7", "forward", "backward",
                                                    "forward", "idle", "end 7"}));
}

// A thread inside a PhaseDomain marks the domain's steps and phases and tells
// the domain's listener; the process's phase, step and listener, and other
// threads, see none of it.
TEST(PhaseTest, ADomainKeepsItsThreadsMarkersToItself) {
  RecordingListener process;
  SetPhaseListener(&process);
  BeginStep(3);
  PhaseScope forward(Phase::kForward);
  RecordingListener dry_run;
  PhaseDomain domain;
  domain.listener = &dry_run;
  std::thread planner([&] {
    PhaseDomainScope in_domain(&domain);
    EXPECT_EQ(CurrentPhase(), Phase::kIdle);
    BeginStep(1);
    {
      PhaseScope backward(Phase::kBackward);
      EXPECT_EQ(CurrentPhase(), Phase::kBackward);
      EXPECT_EQ(CurrentStep(), 1);
    }
    EndStep(1);
  });
  planner.join();
  EXPECT_EQ(CurrentPhase(), Phase::kForward);
  EXPECT_EQ(CurrentStep(), 3);
  EXPECT_EQ(dry_run.log,
            (std::vector<std::string>{"begin 1", "backward", "idle", "end 1"}));
  EXPECT_EQ(process.log, (std::vector<std::string>{"begin 3", "forward"}));
  // Out of the scope, the thread is the process's again.
  {
    PhaseDomain other;
    PhaseDomainScope in_other(&other);
    EXPECT_EQ(CurrentStep(), 0);
  }
  EXPECT_EQ(CurrentStep(), 3);
  SetPhaseListener(nullptr);
}

TEST(PhaseTest, NamesAreTheMetricLabels) {
  EXPECT_EQ(PhaseName(Phase::kOptimizer), "optimizer");
  EXPECT_EQ(PhaseName(Phase::kSnapshot), "snapshot");
  EXPECT_EQ(PhaseName(Phase::kLoad), "load");
}

}  // namespace
}  // namespace memprofd

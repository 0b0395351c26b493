#include "core/common/phase.h"

#include <string>
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

TEST(PhaseTest, NamesAreTheMetricLabels) {
  EXPECT_EQ(PhaseName(Phase::kOptimizer), "optimizer");
  EXPECT_EQ(PhaseName(Phase::kSnapshot), "snapshot");
  EXPECT_EQ(PhaseName(Phase::kLoad), "load");
}

}  // namespace
}  // namespace memprofd

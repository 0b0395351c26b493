// ValidateSessionOptions' rules for the sharding level: every level this
// build implements passes (a single process too, where it has no effect),
// and one it does not is refused before anything starts, as about the
// sharding option, naming the levels that are built.

#include <string>

#include "absl/status/status.h"
#include "core/common/option_status.h"
#include "core/dist/sharding.h"
#include "core/session/session_types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ValidateSessionOptionsShardingTest, TheDefaultIsNone) {
  EXPECT_EQ(SessionOptions().sharding, Sharding::kNone);
}

TEST(ValidateSessionOptionsShardingTest, NoneAndOptimizerPassInASingleProcess) {
  for (Sharding level : {Sharding::kNone, Sharding::kOptimizer}) {
    SessionOptions options;
    ASSERT_FALSE(options.world.distributed());
    options.sharding = level;
    EXPECT_TRUE(ValidateSessionOptions(options).ok()) << ShardingName(level);
  }
}

// The validation and DataParallel agree level by level, so that a level the
// daemon accepts at start is one its first Train can run.
TEST(ValidateSessionOptionsShardingTest, ALevelPassesExactlyWhenItIsBuilt) {
  int refused = 0;
  for (Sharding level : AllShardings()) {
    SessionOptions options;
    options.sharding = level;
    const absl::Status status = ValidateSessionOptions(options);
    const absl::Status built = ShardingBuilt(level);
    EXPECT_EQ(status.ok(), built.ok()) << ShardingName(level) << ": " << status;
    if (built.ok()) continue;
    ++refused;
    EXPECT_EQ(status.code(), built.code()) << status;
    EXPECT_EQ(status.message().rfind("sharding:", 0), 0u) << status;
    EXPECT_THAT(status.message(), HasSubstr(std::string(ShardingName(level))));
    // The levels that would start.
    EXPECT_THAT(status.message(), HasSubstr("none"));
    EXPECT_THAT(status.message(), HasSubstr("optimizer"));
    EXPECT_THAT(status.message(), Not(HasSubstr("--"))) << status;
    EXPECT_EQ(OptionOf(status), "sharding");
  }
  // full (ZeRO-3) is not built yet: the rule is exercised.
  EXPECT_GE(refused, 1);
}

}  // namespace
}  // namespace memprofd

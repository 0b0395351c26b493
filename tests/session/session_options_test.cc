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

TEST(ValidateSessionOptionsShardingTest, EveryLevelPassesInASingleProcess) {
  for (Sharding level : AllShardings()) {
    SessionOptions options;
    ASSERT_FALSE(options.world.distributed());
    options.sharding = level;
    EXPECT_TRUE(ValidateSessionOptions(options).ok()) << ShardingName(level);
  }
}

}  // namespace
}  // namespace memprofd

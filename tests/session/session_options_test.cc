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

TEST(ValidateSessionOptionsTest, APlanCapMustBePositiveAndNamesItsOption) {
  SessionOptions options;
  EXPECT_TRUE(ValidateSessionOptions(options).ok());
  for (absl::Duration cap : {absl::ZeroDuration(), absl::Seconds(-1)}) {
    options.max_plan_time = cap;
    const absl::Status s = ValidateSessionOptions(options);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("max_plan_time"));
    EXPECT_EQ(OptionOf(s), std::optional<std::string>("max_plan_time"));
  }
}

TEST(ValidateSessionOptionsTest, ADeviceMemoryLimitIsBytesOrNoneAndNamesItsOption) {
  SessionOptions options;
  EXPECT_EQ(options.device_memory_limit_bytes, 0);  // no limit
  options.device_memory_limit_bytes = int64_t{6} << 30;
  EXPECT_TRUE(ValidateSessionOptions(options).ok());
  options.device_memory_limit_bytes = -1;
  const absl::Status s = ValidateSessionOptions(options);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("device_memory_limit: must be >= 0"));
  EXPECT_EQ(OptionOf(s), std::optional<std::string>("device_memory_limit"));
}

}  // namespace
}  // namespace memprofd

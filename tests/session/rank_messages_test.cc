// What rank 0 hands a follower in a train command: every offload field a
// request may set (offload_fields.h) must arrive as it was set, and a field
// left unset must stay unset (the follower merges over its own flags).

#include "core/session/rank_messages.h"

#include <gtest/gtest.h>

#include "core/common/json.h"
#include "core/offload/offload_fields.h"

namespace memprofd::rank_messages {
namespace {

// A value unlike the default of each type the offload table uses.
void SetUnlikeDefault(std::optional<bool>* v) { *v = true; }
void SetUnlikeDefault(std::optional<int64_t>* v) { *v = 12345; }
void SetUnlikeDefault(std::optional<int>* v) { *v = 7; }
void SetUnlikeDefault(std::optional<offload::Target>* v) { *v = offload::Target::kHost; }

absl::StatusOr<TrainCommand> RoundTrip(const TrainCommand& sent) {
  absl::StatusOr<Json> json = ParseJson(EncodeTrainCommand(sent));
  if (!json.ok()) return json.status();
  return DecodeTrainCommand(*json);
}

TEST(RankMessagesTest, EveryOffloadFieldReachesAFollowerAloneAndTogether) {
  TrainCommand all;
  all.train.steps = 3;
  all.resume = true;
#define MEMPROFD_EACH_FIELD_(name, ...)                                           \
  {                                                                               \
    TrainCommand one;                                                             \
    SetUnlikeDefault(&one.offload.name);                                          \
    absl::StatusOr<TrainCommand> got = RoundTrip(one);                            \
    ASSERT_TRUE(got.ok()) << #name << ": " << got.status();                       \
    EXPECT_TRUE(got->offload == one.offload) << #name << " did not arrive alone"; \
    SetUnlikeDefault(&all.offload.name);                                          \
  }
  MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_EACH_FIELD_)
#undef MEMPROFD_EACH_FIELD_
  absl::StatusOr<TrainCommand> got = RoundTrip(all);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->offload == all.offload);
  EXPECT_EQ(got->train.steps, 3);
  EXPECT_TRUE(got->resume);

  // Nothing set arrives as nothing set.
  absl::StatusOr<TrainCommand> none = RoundTrip(TrainCommand{});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->offload == offload::OffloadOverrides{});
}

TEST(RankMessagesTest, AnOffloadFieldOfTheWrongKindIsABadCommandNamingIt) {
  for (const char* text :
       {R"({"target": "tape"})", R"({"enabled": 1})", R"({"max_copies_in_flight": 1e12})",
        R"({"prefetch_depth": "auto"})", R"([1])"}) {
    absl::StatusOr<Json> json = ParseJson(text);
    ASSERT_TRUE(json.ok());
    absl::StatusOr<offload::OffloadOverrides> got = OffloadOverridesFromJson(*json);
    ASSERT_FALSE(got.ok()) << text;
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
    EXPECT_NE(got.status().message().find("rank 0's command cannot be read"),
              std::string::npos)
        << got.status();
  }
}

}  // namespace
}  // namespace memprofd::rank_messages

// max_shard_size parsing and the greedy shard split, as huggingface_hub.
#include "core/snapshot/shard_plan.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace snapshot {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseShardSizeTest, AcceptsDecimalUnitsAndBytesLikeHub) {
  EXPECT_EQ(*ParseShardSize("5GB"), 5'000'000'000);
  EXPECT_EQ(*ParseShardSize("500MB"), 500'000'000);
  EXPECT_EQ(*ParseShardSize("100KB"), 100'000);
  EXPECT_EQ(*ParseShardSize("2TB"), 2'000'000'000'000);
  EXPECT_EQ(*ParseShardSize(" 10gb "), 10'000'000'000);
  EXPECT_EQ(*ParseShardSize("1.5GB"), 1'500'000'000);
  EXPECT_EQ(*ParseShardSize("5 GB"), 5'000'000'000);
  EXPECT_EQ(*ParseShardSize("123456"), 123456);
}

TEST(ParseShardSizeTest, RejectsBinaryUnitsAndGarbageSayingWhatToWrite) {
  for (const char* bad : {"5GiB", "5MiB", "", "GB", "abc", "5XB", "5B", "-1GB", "0",
                          "0GB", "-5", "5e30GB", "nanGB", "1,5GB"}) {
    auto s = ParseShardSize(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("\"5GB\"")) << bad;
  }
  EXPECT_THAT(std::string(ParseShardSize("5GiB").status().message()),
              HasSubstr("binary"));
}

std::vector<std::vector<std::string>> Names(const ShardPlan& plan) {
  std::vector<std::vector<std::string>> out;
  for (const Shard& s : plan.shards) out.push_back(s.names);
  return out;
}

constexpr int64_t kGB = 1'000'000'000;

TEST(PlanShardsTest, GreedyInKeyOrderLikeHub) {
  // REFERENCE.md §2.1: [6,6,2,6,2,2] GB with 10 GB shards -> [6], [6+2], [6+2+2].
  const ShardPlan plan = PlanShards({{"a", 6 * kGB, 0},
                                     {"b", 6 * kGB, 1},
                                     {"c", 2 * kGB, 2},
                                     {"d", 6 * kGB, 3},
                                     {"e", 2 * kGB, 4},
                                     {"f", 2 * kGB, 5}},
                                    10 * kGB);
  EXPECT_THAT(Names(plan), ElementsAre(ElementsAre("a"), ElementsAre("b", "c"),
                                       ElementsAre("d", "e", "f")));
  EXPECT_EQ(plan.shards[2].bytes, 10 * kGB);  // exactly at the limit: strict >
  EXPECT_EQ(plan.total_size, 24 * kGB);
  EXPECT_EQ(plan.shards[0].file_name, "model-00001-of-00003.safetensors");
  EXPECT_EQ(plan.shards[2].file_name, "model-00003-of-00003.safetensors");
  EXPECT_TRUE(plan.sharded());
  EXPECT_EQ(plan.weight_map.at("e"), "model-00003-of-00003.safetensors");
}

TEST(PlanShardsTest, OversizeTensorGetsItsOwnShardAtOnce) {
  // Like hub, the oversize tensor's shard is appended while the open shard
  // keeps filling.
  const ShardPlan plan = PlanShards({{"a", 2, 0}, {"big", 12, 1}, {"b", 2, 2}}, 10);
  EXPECT_THAT(Names(plan), ElementsAre(ElementsAre("big"), ElementsAre("a", "b")));
}

TEST(PlanShardsTest, SharedStorageCountedOnceWithItsFirstKey) {
  const ShardPlan plan =
      PlanShards({{"emb", 6, 7}, {"x", 6, 1}, {"head", 6, 7}, {"y", 2, 2}}, 10);
  EXPECT_THAT(Names(plan),
              ElementsAre(ElementsAre("emb", "head"), ElementsAre("x", "y")));
  EXPECT_EQ(plan.total_size, 14);
}

TEST(PlanShardsTest, OneShardIsModelSafetensorsWithoutIndex) {
  const ShardPlan plan = PlanShards({{"a", 1, 0}, {"b", 1, 1}}, 10);
  ASSERT_EQ(plan.shards.size(), 1u);
  EXPECT_EQ(plan.shards[0].file_name, "model.safetensors");
  EXPECT_FALSE(plan.sharded());
  const ShardPlan empty = PlanShards({}, 10);
  ASSERT_EQ(empty.shards.size(), 1u);
  EXPECT_EQ(empty.shards[0].file_name, "model.safetensors");
}

TEST(PlanShardsTest, IndexJsonMatchesTransformers) {
  const ShardPlan plan = PlanShards({{"z.w", 6, 0}, {"a.w", 6, 1}}, 10);
  // json.dumps({"metadata": {"total_size": 12}, "weight_map": ...},
  //            indent=2, sort_keys=True) + "\n"
  EXPECT_EQ(plan.IndexJson(),
            "{\n  \"metadata\": {\n    \"total_size\": 12\n  },\n  \"weight_map\": {\n"
            "    \"a.w\": \"model-00002-of-00002.safetensors\",\n"
            "    \"z.w\": \"model-00001-of-00002.safetensors\"\n  }\n}\n");
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd

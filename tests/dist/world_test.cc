#include "core/dist/world.h"

#include <map>
#include <string>

#include "absl/status/status.h"
#include "core/dist/sharding.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ShardingTest, EveryLevelParsesFromItsNameAndNothingElseDoes) {
  ASSERT_EQ(AllShardings().size(), 4u);
  for (Sharding s : AllShardings()) {
    absl::StatusOr<Sharding> parsed = ParseSharding(ShardingName(s));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, s);
  }
  for (absl::string_view bad : {"", "Optimizer", "zero1", "full "}) {
    absl::StatusOr<Sharding> parsed = ParseSharding(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(), HasSubstr("none, optimizer, gradients, full"));
  }
}

TEST(WorldSpecTest, NoLauncherIsOneProcess) {
  absl::StatusOr<WorldSpec> w = ReadWorldSpec(Env({{"HOSTNAME", "memprofd-3"}}));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->launcher, Launcher::kNone);
  EXPECT_FALSE(w->distributed());
  EXPECT_EQ(DescribeWorld(*w), "single process (world size 1)");
}

TEST(WorldSpecTest, ReadsTorchrunVariables) {
  absl::StatusOr<WorldSpec> w =
      ReadWorldSpec(Env({{"RANK", "3"},
                         {"WORLD_SIZE", "4"},
                         {"LOCAL_RANK", "1"},
                         {"LOCAL_WORLD_SIZE", "2"},
                         {"GROUP_RANK", "1"},
                         {"MASTER_ADDR", "10.0.0.5"},
                         {"MASTER_PORT", "29400"},
                         {"TORCHELASTIC_RESTART_COUNT", "2"},
                         {"TORCHELASTIC_RUN_ID", "job-7"},
                         {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->launcher, Launcher::kTorchrun);
  EXPECT_EQ(w->rank, 3);
  EXPECT_EQ(w->world_size, 4);
  EXPECT_EQ(w->local_rank, 1);
  EXPECT_EQ(w->local_world_size, 2);
  EXPECT_EQ(w->node_rank, 1);
  EXPECT_EQ(w->master_addr, "10.0.0.5");
  EXPECT_EQ(w->master_port, 29400);
  EXPECT_EQ(w->restart_count, 2);
  EXPECT_EQ(w->run_id, "job-7");
  EXPECT_TRUE(w->use_agent_store);
  EXPECT_EQ(DescribeWorld(*w),
            "rank 3 of 4 (torchrun, local 1 of 2, node 1), store 10.0.0.5:29400 "
            "(torchrun agent's), attempt 2");
}

TEST(WorldSpecTest, PlainVariablesDefaultTheStoreToLoopback) {
  // Kubeflow PyTorchJob v1 and a hand-started run set only these four (or two).
  absl::StatusOr<WorldSpec> w = ReadWorldSpec(Env({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->master_addr, "127.0.0.1");
  EXPECT_EQ(w->master_port, 29500);
  EXPECT_FALSE(w->use_agent_store);
  EXPECT_EQ(w->local_rank, 0);
}

TEST(WorldSpecTest, NodeRankWithoutGroupRankFollowsTheLocalWorld) {
  // Kubeflow's PyTorchJob: one rank per pod, no GROUP_RANK.
  absl::StatusOr<WorldSpec> w = ReadWorldSpec(Env({{"RANK", "3"}, {"WORLD_SIZE", "4"}}));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->node_rank, 3);
  // Two ranks per host: ranks 2 and 3 are host 1.
  w = ReadWorldSpec(Env({{"RANK", "3"},
                         {"WORLD_SIZE", "4"},
                         {"LOCAL_RANK", "1"},
                         {"LOCAL_WORLD_SIZE", "2"}}));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->node_rank, 1);
}

TEST(WorldSpecTest, WorldOfOneIsOneProcess) {
  absl::StatusOr<WorldSpec> w = ReadWorldSpec(Env({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_FALSE(w->distributed());
}

TEST(WorldSpecTest, ExpandsRankPlaceholders) {
  WorldSpec w;
  w.rank = 3;
  w.local_rank = 1;
  w.node_rank = 2;
  EXPECT_EQ(ExpandRankPlaceholders("/run/m-{rank}.json", w), "/run/m-3.json");
  EXPECT_EQ(ExpandRankPlaceholders("{node_rank}/{local_rank}/{rank}{rank}", w), "2/1/33");
  EXPECT_EQ(ExpandRankPlaceholders("/tmp/plain", w), "/tmp/plain");
  EXPECT_EQ(ExpandRankPlaceholders("{ranks}", w), "{ranks}");  // not a placeholder
}

TEST(WorldSpecTest, KubeflowTrainerRankIsNodeTimesProcsPlusLocal) {
  absl::StatusOr<WorldSpec> w =
      ReadWorldSpec(Env({{"PET_NNODES", "3"},
                         {"PET_NPROC_PER_NODE", "2"},
                         {"PET_NODE_RANK", "2"},
                         {"LOCAL_RANK", "1"},
                         {"PET_MASTER_ADDR", "job-node-0-0.job"},
                         {"PET_MASTER_PORT", "29501"}}));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->launcher, Launcher::kKubeflowTrainer);
  EXPECT_EQ(w->world_size, 6);
  EXPECT_EQ(w->rank, 5);
  EXPECT_EQ(w->master_addr, "job-node-0-0.job");
  EXPECT_EQ(w->master_port, 29501);
}

TEST(WorldSpecTest, StatefulSetRankFromPodIndexOrHostname) {
  absl::StatusOr<WorldSpec> by_index = ReadWorldSpec(Env(
      {{"MEMPROFD_WORLD_SIZE", "4"}, {"MEMPROFD_POD_INDEX", "2"}, {"HOSTNAME", "x-1"}}));
  ASSERT_TRUE(by_index.ok()) << by_index.status();
  EXPECT_EQ(by_index->launcher, Launcher::kStatefulSet);
  EXPECT_EQ(by_index->rank, 2);
  absl::StatusOr<WorldSpec> by_host =
      ReadWorldSpec(Env({{"MEMPROFD_WORLD_SIZE", "4"},
                         {"HOSTNAME", "memprofd-3"},
                         {"MASTER_ADDR", "memprofd-0.memprofd"}}));
  ASSERT_TRUE(by_host.ok()) << by_host.status();
  EXPECT_EQ(by_host->rank, 3);
  EXPECT_EQ(by_host->master_addr, "memprofd-0.memprofd");
}

TEST(WorldSpecTest, TorchrunWinsOverTheOthers) {
  absl::StatusOr<WorldSpec> w = ReadWorldSpec(Env({{"RANK", "1"},
                                                   {"WORLD_SIZE", "2"},
                                                   {"PET_NNODES", "5"},
                                                   {"MEMPROFD_WORLD_SIZE", "9"}}));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->launcher, Launcher::kTorchrun);
  EXPECT_EQ(w->world_size, 2);
}

// Each bad environment, with a piece of the message that tells what to fix.
TEST(WorldSpecTest, TakesEveryFormOfHostAddress) {
  for (const char* addr : {"10.0.0.5", "::1", "[fe80::1]", "2001:db8::7",
                           "memprofd-0.memprofd.default.svc.cluster.local.", "localhost",
                           "job-node-0-0.job"}) {
    absl::StatusOr<WorldSpec> w =
        ReadWorldSpec(Env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", addr}}));
    ASSERT_TRUE(w.ok()) << addr << ": " << w.status();
    EXPECT_EQ(w->master_addr, addr);
  }
}

TEST(WorldSpecTest, RefusesBadEnvironmentsNamingTheVariable) {
  const std::pair<std::map<std::string, std::string>, std::string> cases[] = {
      {{{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not"},
      {{{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK is 2 but the world has 2 ranks"},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK='-1' must be an integer"},
      {{{"RANK", "one"}, {"WORLD_SIZE", "2"}}, "RANK='one'"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE='0'"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}}, "MASTER_PORT='0'"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, "from 1 to 65535"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}}, "MASTER_ADDR is empty"},
      // Addresses that cannot name a host fail at once, not after the
      // store's whole connect timeout.
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "::::"}},
       "MASTER_ADDR is \"::::\", which is neither"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "host name"}},
       "neither an IP address nor a host name"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "-bad.example"}},
       "neither an IP address nor a host name"},
      {{{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_MASTER_ADDR", "a..b"}},
       "PET_MASTER_ADDR is"},
      {{{"RANK", "0"},
        {"WORLD_SIZE", "2"},
        {"LOCAL_RANK", "2"},
        {"LOCAL_WORLD_SIZE", "2"}},
       "LOCAL_RANK is 2 but LOCAL_WORLD_SIZE is 2"},
      {{{"PET_NNODES", "2"}, {"PET_NODE_RANK", "2"}},
       "PET_NODE_RANK is 2 but PET_NNODES is 2"},
      {{{"MEMPROFD_WORLD_SIZE", "2"}, {"HOSTNAME", "worker"}}, "set MEMPROFD_POD_INDEX"},
      {{{"MEMPROFD_WORLD_SIZE", "2"}, {"MEMPROFD_POD_INDEX", "5"}}, "the pod index is 5"},
  };
  for (const auto& [vars, message] : cases) {
    absl::StatusOr<WorldSpec> w = ReadWorldSpec(Env(vars));
    ASSERT_FALSE(w.ok()) << message;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
    EXPECT_THAT(std::string(w.status().message()), HasSubstr(message));
  }
}

}  // namespace
}  // namespace memprofd

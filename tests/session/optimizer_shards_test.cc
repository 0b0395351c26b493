// How a run splits the optimizer state (optimizer_shards.h), and the
// re-sharding a resume makes with it: a checkpoint written by 2 ranks
// restored by 3 (and by 1) gives each rank exactly its flat pieces of the
// state, bit for bit.

#include "core/session/optimizer_shards.h"

#include <ATen/ATen.h>

#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/model/llama.h"
#include "core/train/trainer.h"
#include "core/train/trainer_state.h"
#include "gtest/gtest.h"
#include "tests/testing/llama.h"
#include "tests/testing/train.h"

namespace memprofd {
namespace {

using testing::CheckAndRun;

using testing::MakeLlama;
using testing::SmallLlamaConfig;

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes().equals(b.sizes()) && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) ==
             0;
}

TEST(OptimizerShardsTest, ShardedOnlyWithSeveralRanksAndALevel) {
  SessionOptions options;
  options.sharding = Sharding::kOptimizer;
  EXPECT_FALSE(OptimizerStateSharded(options));  // a single process trains unsharded
  options.world.world_size = 2;
  EXPECT_TRUE(OptimizerStateSharded(options));
  options.sharding = Sharding::kGradients;  // keeps the owned state too
  EXPECT_TRUE(OptimizerStateSharded(options));
  options.sharding = Sharding::kNone;
  EXPECT_FALSE(OptimizerStateSharded(options));
}

TEST(OptimizerShardsTest, TheShardIsThisRanksPlaceWhenSharded) {
  SessionOptions options;
  options.sharding = Sharding::kFull;
  EXPECT_FALSE(OptimizerShard(options).has_value());
  options.world.world_size = 4;
  options.world.rank = 3;
  const std::optional<FlatShardSpec> shard = OptimizerShard(options);
  ASSERT_TRUE(shard.has_value());
  EXPECT_EQ(shard->rank, 3);
  EXPECT_EQ(shard->world_size, 4);
}

TEST(OptimizerShardsTest, ShardedParametersAreTheTrainableOnesEachStorageOnce) {
  std::unique_ptr<LlamaModel> model = MakeLlama(SmallLlamaConfig(), 3);
  // The small model ties its head to the embedding: it appears once.
  std::vector<std::pair<std::string, std::vector<int64_t>>> want;
  std::set<const void*> seen;
  for (const auto& [name, p] : model->NamedParameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second && p.requires_grad())
      want.emplace_back(name, p.sizes().vec());
  }
  EXPECT_LT(want.size(), model->NamedParameters().size());
  EXPECT_EQ(ShardedParameters(*model), want);
}

// A checkpoint's whole state (as a checkpoint of 2 ranks holds it once
// assembled) restored by 3 ranks and by 1: each rank's pieces, laid end to
// end, are the whole state bit for bit.
TEST(OptimizerShardsTest, ACheckpointOfTwoRanksReshardsOntoThreeAndOne) {
  std::unique_ptr<LlamaModel> trained = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(trained.get());
  TrainOptions options;
  options.steps = 2;
  options.batch_size = 2;
  options.seq_len = 16;
  ASSERT_TRUE(CheckAndRun(trainer, options).ok());
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& [name, t] : trainer.NamedOptimizerState()) {
    state.emplace_back(name, t.detach().clone());
  }
  absl::StatusOr<TrainerState> trainer_state =
      TrainerStateFromJson(TrainerStateToJson(trainer.State()), "t");
  ASSERT_TRUE(trainer_state.ok()) << trainer_state.status();

  for (int world : {3, 1}) {
    SCOPED_TRACE(world);
    std::map<std::string, std::vector<at::Tensor>> pieces;
    for (int rank = 0; rank < world; ++rank) {
      SessionOptions session;
      session.sharding = Sharding::kOptimizer;
      session.world.world_size = world;
      session.world.rank = rank;
      const std::optional<FlatShardSpec> shard = OptimizerShard(session);
      EXPECT_EQ(shard.has_value(), world > 1);
      std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
      Trainer restored(m.get());
      ASSERT_TRUE(
          restored.Restore(*trainer_state, state, shard ? &*shard : nullptr).ok());
      for (const auto& [name, t] : restored.NamedOptimizerState()) {
        pieces[name].push_back(t.detach().clone());
      }
    }
    ASSERT_EQ(pieces.size(), state.size());
    for (const auto& [name, whole] : state) {
      ASSERT_EQ(pieces.count(name), 1u) << name;
      const std::vector<at::Tensor>& mine = pieces.at(name);
      if (whole.dim() == 0) {  // a step: the same on every rank with a piece
        for (const at::Tensor& t : mine) EXPECT_TRUE(BitEqual(t, whole)) << name;
        continue;
      }
      EXPECT_TRUE(BitEqual(at::cat(mine).view(whole.sizes()), whole)) << name;
    }
  }
}

}  // namespace
}  // namespace memprofd

// Who owns which parameter's optimizer state (optimizer_shards.h), and the
// re-sharding a resume makes with it: a checkpoint written by 2 ranks
// restored by 3 (and by 1) gives each rank exactly the state of the
// parameters it owns now, bit for bit.

#include "core/session/optimizer_shards.h"

#include <ATen/ATen.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/dist/optimizer_sharding.h"
#include "core/model/llama.h"
#include "core/train/trainer.h"
#include "core/train/trainer_state.h"
#include "gtest/gtest.h"
#include "tests/testing/llama.h"

namespace memprofd {
namespace {

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

TEST(OptimizerShardsTest, OwnersPartitionTheTrainableParametersAsBalancedOwners) {
  std::unique_ptr<LlamaModel> model = MakeLlama(SmallLlamaConfig(), 3);
  // Each storage once: the small model ties its head to the embedding.
  std::vector<int64_t> numels;
  std::set<const void*> seen;
  for (const auto& [name, p] : model->NamedParameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second && p.requires_grad())
      numels.push_back(p.numel());
  }
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE(world);
    const std::vector<std::pair<std::string, int>> owners =
        OptimizerOwners(*model, world);
    ASSERT_EQ(owners.size(), numels.size());
    const std::vector<int> expected = BalancedOwners(numels, world);
    std::set<std::string> all;
    for (size_t k = 0; k < owners.size(); ++k) {
      EXPECT_EQ(owners[k].second, expected[k]) << owners[k].first;
      all.insert(owners[k].first);
    }
    size_t owned = 0;
    for (int rank = 0; rank < world; ++rank) {
      owned += OwnedParameters(*model, rank, world).size();
    }
    EXPECT_EQ(owned, all.size());  // each parameter on exactly one rank
  }
}

TEST(OptimizerShardsTest, ACheckpointOfTwoRanksReshardsOntoThreeAndOne) {
  // The whole state of a trained model, as a checkpoint of 2 ranks holds it
  // once assembled.
  std::unique_ptr<LlamaModel> trained = MakeLlama(SmallLlamaConfig(), 5);
  Trainer trainer(trained.get());
  TrainOptions options;
  options.steps = 2;
  options.batch_size = 2;
  options.seq_len = 16;
  ASSERT_TRUE(trainer.Run(options).ok());
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& [name, t] : trainer.NamedOptimizerState()) {
    state.emplace_back(name, t.detach().clone());
  }
  absl::StatusOr<TrainerState> trainer_state =
      TrainerStateFromJson(TrainerStateToJson(trainer.State()), "t");
  ASSERT_TRUE(trainer_state.ok()) << trainer_state.status();

  for (int world : {3, 1}) {
    SCOPED_TRACE(world);
    std::map<std::string, int> restored_on;
    for (int rank = 0; rank < world; ++rank) {
      std::unique_ptr<LlamaModel> m = MakeLlama(SmallLlamaConfig(), 5);
      const std::set<std::string> owned = OwnedParameters(*m, rank, world);
      Trainer restored(m.get());
      ASSERT_TRUE(restored.Restore(*trainer_state, state, &owned).ok());
      std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
      for (const auto& [name, t] : restored.NamedOptimizerState()) {
        ASSERT_EQ(owned.count(name.substr(0, name.rfind('.'))), 1u) << name;
        EXPECT_TRUE(BitEqual(t, by_name.at(name))) << name;
        EXPECT_EQ(restored_on.emplace(name, rank).second, true) << name;
      }
    }
    EXPECT_EQ(restored_on.size(), state.size());
  }
}

}  // namespace
}  // namespace memprofd

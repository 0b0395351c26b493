// Snapshots of the real Llama model (core/model): loading a snapshot gives
// the same logits bit for bit; a tied head is written once and restored.
#include <ATen/ATen.h>

#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/snapshot/loader.h"
#include "core/snapshot/writer.h"
#include "gtest/gtest.h"
#include "tests/snapshot/test_util.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace snapshot {
namespace {

using ::memprofd::testing::TempDir;

TensorList StateDict(const LlamaModel& model) {
  TensorList out;
  for (auto& [name, t] : model.NamedParameters()) out.emplace_back(name, t);
  return out;
}

class ModelSnapshotTest : public ::testing::TestWithParam<SnapshotDtype> {};

TEST_P(ModelSnapshotTest, LoadedSnapshotGivesTheSameLogits) {
  auto config = LlamaConfig::Preset("tiny");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->tie_word_embeddings);
  auto model = LlamaModel::Create(*config, 1);
  ASSERT_TRUE(model.ok()) << model.status();

  TempDir root;
  SnapshotOptions o;
  o.dtype = GetParam();
  o.tie_word_embeddings = config->tie_word_embeddings;  // from the config
  o.max_shard_size = 5'000'000;                         // sharded
  o.staging_bytes = 1 << 20;
  auto m =
      SnapshotWriter(root.path()).Write("s", StateDict(**model), config->ToJson(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->dropped_tied_lm_head);
  EXPECT_GT(m->num_shards, 1);

  auto loaded = LoadSafetensorsDirectory(root.Join("s"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (const auto& [name, t] : loaded->tensors) EXPECT_NE(name, "lm_head.weight");
  auto loaded_config = LlamaConfig::FromJson(loaded->config_json);
  ASSERT_TRUE(loaded_config.ok()) << loaded_config.status();
  EXPECT_EQ(loaded_config->num_hidden_layers, config->num_hidden_layers);
  EXPECT_EQ(loaded_config->torch_dtype,
            GetParam() == SnapshotDtype::kBFloat16 ? "bfloat16" : "float32");
  auto restored = LlamaModel::Create(*loaded_config, 2);  // other weights
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE((*restored)->LoadStateDict(loaded->tensors).ok());

  // The reference: the original weights rounded as the snapshot stores them.
  if (GetParam() == SnapshotDtype::kBFloat16) {
    at::NoGradGuard no_grad;
    for (auto& [name, t] : (*model)->NamedParameters()) {
      t.copy_(t.to(at::kBFloat16).to(at::kFloat));
    }
  }
  const at::Tensor ids = at::randint(0, config->vocab_size, {2, 16}, at::kLong);
  at::Tensor expected, actual;
  {
    at::NoGradGuard no_grad;
    expected = (*model)->Forward(ids);
    actual = (*restored)->Forward(ids);
  }
  EXPECT_TRUE(testing::BitEqual(expected, actual));
  // The tie survives: the head is the embedding again.
  const auto params = (*restored)->NamedParameters();
  EXPECT_TRUE(params.front().second.is_same(params.back().second));
}

INSTANTIATE_TEST_SUITE_P(KeepAndBf16, ModelSnapshotTest,
                         ::testing::Values(SnapshotDtype::kKeep,
                                           SnapshotDtype::kBFloat16),
                         [](const auto& info) {
                           return std::string(SnapshotDtypeName(info.param));
                         });

}  // namespace
}  // namespace snapshot
}  // namespace memprofd

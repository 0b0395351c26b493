// A merged snapshot's weights: each adapted projection written as
// W + scaling · B·A (peft's merge_and_unload), every other tensor as it is,
// the live weights untouched, one merged projection held at a time.

#include "core/session/merged_weights.h"

#include <torch/torch.h>

#include <map>
#include <string>

#include "core/model/lora.h"
#include "core/snapshot/loader.h"
#include "core/snapshot/writer.h"
#include "gtest/gtest.h"
#include "tests/testing/llama.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace {

TEST(MergedWeightsTest, WritesEachProjectionMergedAndLeavesTheModelAsItWas) {
  LlamaConfig config = ::memprofd::testing::SmallLlamaConfig();
  config.tie_word_embeddings = true;
  std::unique_ptr<LlamaModel> model = ::memprofd::testing::MakeLlama(config, 5);
  LoraOptions lora;
  lora.r = 4;
  lora.alpha = 12;
  lora.use_rslora = true;
  lora.target_modules = {"q_proj", "down_proj"};
  ASSERT_TRUE(model->AddLora(lora, 9).ok());
  ::memprofd::testing::DrawLoraB(*model, 3);
  std::map<std::string, at::Tensor> before;
  for (const auto& [name, t] : model->NamedBaseParameters()) before[name] = t.clone();

  MergedWeights merged(*model);
  ::memprofd::testing::TempDir root;
  snapshot::SnapshotOptions options;
  options.kind = snapshot::SnapshotKind::kMerged;
  options.tie_word_embeddings = true;
  absl::StatusOr<snapshot::SnapshotManifest> manifest =
      snapshot::SnapshotWriter(root.path())
          .Write("m", merged.tensors(), model->config().ToJson(), options, nullptr,
                 nullptr, &merged);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->kind, "merged");
  // The largest merged projection: down_proj's [hidden, intermediate].
  EXPECT_EQ(manifest->peak_gathered_bytes,
            config.hidden_size * config.intermediate_size * 4);

  absl::StatusOr<snapshot::LoadedWeights> written =
      snapshot::LoadSafetensorsDirectory(manifest->directory);
  ASSERT_TRUE(written.ok()) << written.status();
  std::map<std::string, at::Tensor> out(written->tensors.begin(), written->tensors.end());
  EXPECT_EQ(out.count("lm_head.weight"), 0u);  // tied, as transformers saves it
  int merged_count = 0;
  std::map<std::string, AdaptedProjection> adapted;
  for (AdaptedProjection& p : model->AdaptedProjections()) adapted[p.weight_name] = p;
  EXPECT_EQ(adapted.size(), 2u * static_cast<size_t>(config.num_hidden_layers));
  const double scaling = 12 / std::sqrt(4.0);
  for (const auto& [name, t] : model->NamedBaseParameters()) {
    EXPECT_TRUE(torch::equal(t, before[name])) << name << " changed";
    if (name == "lm_head.weight") continue;
    ASSERT_EQ(out.count(name), 1u) << name;
    auto it = adapted.find(name);
    if (it == adapted.end()) {
      EXPECT_TRUE(torch::equal(out[name], t)) << name;
      continue;
    }
    ++merged_count;
    const at::Tensor expected =
        t + at::mm(it->second.adapter.b, it->second.adapter.a).detach() * scaling;
    EXPECT_TRUE(torch::allclose(out[name], expected, 1e-6, 1e-6)) << name;
    EXPECT_FALSE(torch::allclose(out[name], t, 1e-4, 1e-4)) << name << " was not merged";
  }
  EXPECT_EQ(merged_count, 2 * config.num_hidden_layers);
  // Nothing merged is held once written.
  for (const auto& [name, t] : merged.tensors()) {
    if (adapted.count(name)) {
      EXPECT_EQ(t.storage().nbytes(), 0u) << name;
    }
  }
}

}  // namespace
}  // namespace memprofd

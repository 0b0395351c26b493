// LoRA as peft computes it and saves it, checked with peft itself: the
// daemon's base weights (a weights snapshot) and adapters (an adapter
// snapshot) load into transformers and peft.PeftModel.from_pretrained, which
// give the same loss on the same tokens and the same gradients of every
// adapter, with every base parameter frozen (tests/snapshot/
// lora_reference.py).

#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>

#include "core/common/json.h"
#include "core/model/llama.h"
#include "core/model/lora.h"
#include "core/snapshot/writer.h"
#include "gtest/gtest.h"
#include "tests/snapshot/test_util.h"
#include "tests/testing/command.h"
#include "tests/testing/llama.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace snapshot {
namespace {

using ::memprofd::testing::TempDir;

TensorList PeftNamed(const std::vector<std::pair<std::string, at::Tensor>>& adapters,
                     bool grads) {
  TensorList out;
  for (const auto& [name, t] : adapters) {
    out.emplace_back(PeftAdapterName(name), grads ? t.grad() : t.detach());
  }
  return out;
}

TEST(LoraPeftTest, PeftLoadsTheAdaptersAndComputesTheSameLossAndGradients) {
  LlamaConfig config = ::memprofd::testing::SmallLlamaConfig();
  config.tie_word_embeddings = false;
  config.vocab_size = 97;
  config.hidden_size = 64;
  config.intermediate_size = 96;
  std::unique_ptr<LlamaModel> model = ::memprofd::testing::MakeLlama(config, 5);
  LoraOptions lora;
  lora.r = 4;
  lora.alpha = 12;
  lora.target_modules = {"all-linear"};
  ASSERT_TRUE(model->AddLora(lora, 9).ok());
  ::memprofd::testing::DrawLoraB(*model, 3);  // B off zero, so A's gradients are not
  const at::Tensor ids =
      torch::randint(0, config.vocab_size, {2, 17}, at::detail::createCPUGenerator(4));
  const at::Tensor logits = model->Forward(ids);
  const int64_t n = ids.size(0) * (ids.size(1) - 1);
  const at::Tensor loss = torch::cross_entropy_loss(
      logits.narrow(1, 0, ids.size(1) - 1).reshape({n, config.vocab_size}),
      ids.narrow(1, 1, ids.size(1) - 1).reshape({n}));
  loss.backward();
  for (const auto& [name, t] : model->NamedBaseParameters()) {
    EXPECT_FALSE(t.grad().defined()) << name << " is frozen";
  }

  TempDir root;
  SnapshotWriter writer(root.path());
  SnapshotOptions base;
  base.staging_bytes = 1 << 20;
  ASSERT_TRUE(
      writer.Write("base", model->NamedBaseParameters(), config.ToJson(), base).ok());
  SnapshotOptions adapter = base;
  adapter.kind = SnapshotKind::kAdapter;
  absl::StatusOr<SnapshotManifest> written =
      writer.Write("adapter", PeftNamed(model->NamedAdapters(), false),
                   AdapterConfigJson(lora, root.Join("base")), adapter);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->kind, "adapter");
  EXPECT_EQ(testing::ListDir(root.Join("adapter")),
            (std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors",
                                      "memprofd_manifest.json"}));
  ASSERT_TRUE(writer
                  .Write("grads", PeftNamed(model->NamedAdapters(), true),
                         AdapterConfigJson(lora, root.Join("base")), adapter)
                  .ok());
  {
    std::ofstream f(root.Join("ids.json"));
    Json rows = Json::array();
    for (int64_t b = 0; b < ids.size(0); ++b) {
      Json row = Json::array();
      for (int64_t t = 0; t < ids.size(1); ++t) row.push_back(ids[b][t].item<int64_t>());
      rows.push_back(row);
    }
    f << DumpJson(rows);
  }

  std::string out;
  ASSERT_EQ(::memprofd::testing::RunPython(
                {::memprofd::testing::SourcePath("tests/snapshot/lora_reference.py"),
                 root.path()},
                &out),
            0)
      << out;
  const std::string last = out.substr(out.rfind('{'));
  absl::StatusOr<Json> result = ParseJson(last);
  ASSERT_TRUE(result.ok()) << out;
  std::cout << "peft: " << last;
  const double peft_loss = (*result)["loss"].get<double>();
  EXPECT_NEAR(peft_loss, loss.item<double>(), 1e-5 * std::abs(peft_loss));
  EXPECT_EQ((*result)["trainable"].get<int64_t>(),
            static_cast<int64_t>(model->NamedAdapters().size()));
  EXPECT_EQ((*result)["unmatched"].size(), 0u) << out;
  const double largest = (*result)["max_grad"].get<double>();
  EXPECT_GT(largest, 0);
  EXPECT_LE((*result)["max_grad_diff"].get<double>(), 1e-4 * largest) << out;
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd

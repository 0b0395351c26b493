#include "tests/testing/llama.h"

#include <ATen/ATen.h>

#include <string>

#include "gtest/gtest.h"

namespace memprofd {
namespace testing {

LlamaConfig AsWindowedQwen2(LlamaConfig c) {
  c.architecture = "Qwen2ForCausalLM";
  c.model_type = "qwen2";
  c.sliding_window = 8;
  c.max_window_layers = 1;
  c.layer_types = {"full_attention", "sliding_attention"};
  return c;
}

LlamaConfig AsQwen3(LlamaConfig c) {
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.tie_word_embeddings = false;
  c.attention_bias = true;
  c.layer_types.assign(static_cast<size_t>(c.num_hidden_layers), "full_attention");
  return c;
}

void DrawLoraB(LlamaModel& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (auto& [name, t] : model.NamedAdapters()) {
    if (name.find("lora_B") != std::string::npos) {
      t.copy_(at::normal(0.0, 0.05, t.sizes(), gen));
    }
  }
}

LlamaConfig SmallLlamaConfig() {
  LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  return c;
}

LlamaConfig PresetConfig(const std::string& name) {
  absl::StatusOr<LlamaConfig> c = LlamaConfig::Preset(name);
  if (!c.ok()) {
    ADD_FAILURE() << c.status();
    return SmallLlamaConfig();
  }
  return *std::move(c);
}

std::unique_ptr<LlamaModel> MakeLlama(const LlamaConfig& config, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<LlamaModel>> m = LlamaModel::Create(config, seed);
  if (!m.ok()) {
    ADD_FAILURE() << m.status();
    return nullptr;
  }
  return *std::move(m);
}

}  // namespace testing
}  // namespace memprofd

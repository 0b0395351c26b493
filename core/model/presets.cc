// LlamaConfig's built-in models (LlamaConfig::Preset, config.h).

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/utf8.h"
#include "core/model/config.h"

namespace memprofd {

std::vector<std::string> LlamaConfig::PresetNames() {
  return {"tiny", "small", "llama-3.2-1b", "llama-1b", "qwen2.5-0.5b", "smollm2-135m"};
}

absl::StatusOr<LlamaConfig> LlamaConfig::Preset(absl::string_view name) {
  LlamaConfig c;
  c.vocab_size = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  if (name == "tiny") {
    c.hidden_size = 256;
    c.intermediate_size = 1024;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.max_position_embeddings = 512;
    return c;
  }
  if (name == "small") {
    c.hidden_size = 512;
    c.intermediate_size = 1792;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 1024;
    return c;
  }
  if (name == "llama-3.2-1b" || name == "llama-1b") {
    // Llama-3.2-1B as its config.json gives it: 1,235,814,400 parameters,
    // 4.9 GB in float32, about 20 GB with gradients and AdamW state; meant
    // for a GPU. The daemon's byte-level data use ids < 256 of the 128256;
    // a token file can use them all. The rotary tables for all 131072
    // positions take 64 MiB on the device.
    c.vocab_size = 128256;
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_hidden_layers = 16;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000.0;
    c.rope_scaling.rope_type = "llama3";
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 8192;
    return c;
  }
  if (name == "qwen2.5-0.5b") {
    // Qwen2.5-0.5B as its config.json gives it (its sliding window is
    // configured but off: use_sliding_window false).
    c.architecture = "Qwen2ForCausalLM";
    c.model_type = "qwen2";
    c.vocab_size = 151936;
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 14;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 32768;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.max_window_layers = 24;
    c.layer_types.assign(24, "full_attention");
    return c;
  }
  if (name == "smollm2-135m") {
    // SmolLM2-135M as its config.json gives it.
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 30;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.max_position_embeddings = 8192;
    c.rope_theta = 100000.0;
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model preset ", Echo(name),
                   "; known presets: ", absl::StrJoin(PresetNames(), ", ")));
}

}  // namespace memprofd

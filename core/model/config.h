#ifndef MEMPROFD_CORE_MODEL_CONFIG_H_
#define MEMPROFD_CORE_MODEL_CONFIG_H_

// The configuration of a Llama-architecture causal language model, in the
// terms of Hugging Face's config.json (transformers' LlamaConfig).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// How the model computes attention; both give the same result within float
// rounding. Named as transformers' attn_implementation values.
enum class AttentionImplementation {
  // at::scaled_dot_product_attention, causal, with grouped-query heads given
  // as they are: a fused kernel (flash attention on the CPU; flash or
  // memory-efficient on CUDA) that keeps no [B, H, T, T] scores for
  // backward. The default, as in transformers.
  kSdpa = 0,
  // transformers' eager_attention_forward: matmul, causal mask, float32
  // softmax, matmul, with key/value heads repeated.
  kEager = 1,
};

// "sdpa" / "eager".
absl::string_view AttentionImplementationName(AttentionImplementation attention);
// Parses "sdpa" or "eager"; INVALID_ARGUMENT otherwise.
absl::StatusOr<AttentionImplementation> ParseAttentionImplementation(
    absl::string_view name);

// The rotary embedding's scaling, as transformers 5 keeps it in
// config.rope_parameters (older config.json files: "rope_scaling"), and as
// modeling_rope_utils computes inv_freq from it. A plain value type.
struct RopeScaling {
  // "default" (no scaling), "linear" (inv_freq / factor), "llama3" (Llama
  // 3.1's wavelength-dependent scaling) or "yarn" (YaRN, with its
  // attention factor on cos and sin).
  std::string rope_type = "default";
  double factor = 1.0;  // linear, llama3, yarn
  // llama3 and yarn: the pretraining context; transformers defaults it to
  // max_position_embeddings.
  int64_t original_max_position_embeddings = 0;
  double low_freq_factor = 0.0;   // llama3
  double high_freq_factor = 0.0;  // llama3
  // yarn's optional fields, unset when config.json does not give them
  // (transformers' defaults then: attention_factor from factor and the
  // mscales, beta_fast 32, beta_slow 1, truncate true).
  std::optional<double> attention_factor;
  std::optional<double> beta_fast;
  std::optional<double> beta_slow;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  std::optional<bool> truncate;

  friend bool operator==(const RopeScaling& a, const RopeScaling& b);
};

// The rope types RopeScaling supports, for messages: "default, linear, llama3, yarn".
const char* SupportedRopeTypes();

// The fields of a transformers LlamaConfig that determine the model's shape
// and numerics. A plain value type.
struct LlamaConfig {
  // The only architecture supported; config.json's "architectures" must name it.
  static constexpr const char* kArchitecture = "LlamaForCausalLM";

  std::string architecture = kArchitecture;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  // Grouped-query attention: each key/value head serves
  // num_attention_heads / num_key_value_heads query heads.
  int64_t num_key_value_heads = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // config.json's head_dim when it gives one; 0: hidden_size /
  // num_attention_heads (transformers' default).
  int64_t explicit_head_dim = 0;
  bool tie_word_embeddings = false;
  // The dtype the weights are stored in ("float32", "bfloat16", "float16").
  // The daemon trains in float32 whatever this says; it is kept for
  // snapshots and config.json.
  std::string torch_dtype = "float32";

  int64_t head_dim() const {
    if (explicit_head_dim > 0) return explicit_head_dim;
    return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
  }

  // Parses a Hugging Face config.json. Fields absent from the file take
  // transformers' LlamaConfig defaults, except the shape fields (vocab_size,
  // hidden_size, intermediate_size, num_hidden_layers, num_attention_heads),
  // which are required. INVALID_ARGUMENT for malformed JSON, a missing or
  // mistyped field, an architecture other than LlamaForCausalLM, options this
  // implementation does not support (a rope type other than default,
  // linear, llama3 and yarn, a partial_rotary_factor, attention_bias,
  // mlp_bias, a hidden_act other than silu), and everything Validate()
  // rejects. The rotary settings come from "rope_scaling" when it is set,
  // else from "rope_parameters" (transformers 5), rope_theta from that dict
  // or the top level, as transformers 5.17 reads them.
  static absl::StatusOr<LlamaConfig> FromJson(absl::string_view json);

  // A config.json that transformers' AutoConfig / LlamaForCausalLM load
  // (architectures, model_type "llama", hidden_act "silu", ...), pretty
  // printed with an indent of 2, with the rotary settings as transformers
  // 5.17 writes them ("rope_parameters": rope_theta, rope_type and the
  // type's fields).
  std::string ToJson() const;

  // OK, or INVALID_ARGUMENT saying which field is wrong and how to fix it:
  // unknown architecture, non-positive sizes or epsilon/theta, sizes whose
  // parameter count overflows int64,
  // hidden_size % num_attention_heads != 0 (transformers' LlamaConfig
  // refuses it even with an explicit head_dim), odd head_dim (rotary
  // embedding needs pairs), num_attention_heads % num_key_value_heads != 0,
  // an unsupported torch_dtype, rope scaling fields out of range (factor
  // < 1, llama3's high_freq_factor <= low_freq_factor, a non-positive
  // original_max_position_embeddings).
  absl::Status Validate() const;

  // The number of parameters (unique storages: a tied head counts once);
  // -1 when it would not fit int64, which Validate() refuses.
  int64_t NumParameters() const;

  // Built-in models:
  //   "tiny":  byte-level vocabulary (256), hidden 256, intermediate 1024,
  //            4 layers, 8 heads, 4 key/value heads, 512 positions, tied
  //            head; exactly 4,000,000 parameters. The daemon's default.
  //   "small": vocabulary 256, hidden 512, intermediate 1792, 8 layers,
  //            8 heads, 8 key/value heads, 1024 positions, tied head;
  //            about 30.5M parameters.
  //   "llama-3.2-1b": Llama-3.2-1B (vocabulary 128256, hidden 2048,
  //            intermediate 8192, 16 layers, 32 heads, 8 key/value heads,
  //            head_dim 64, 131072 positions, rope_theta 500000 with its
  //            llama3 scaling: factor 32, low_freq_factor 1,
  //            high_freq_factor 4, original_max_position_embeddings 8192;
  //            rms_norm_eps 1e-5, tied head); 1,235,814,400 parameters,
  //            for GPUs. "llama-1b" is the same model (its older name).
  // INVALID_ARGUMENT listing the known names otherwise.
  static absl::StatusOr<LlamaConfig> Preset(absl::string_view name);
  static std::vector<std::string> PresetNames();

  friend bool operator==(const LlamaConfig& a, const LlamaConfig& b);
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_MODEL_CONFIG_H_

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
  // "default" (no scaling), "linear" (inv_freq / factor), "dynamic"
  // (dynamic NTK: rescales theta only for sequences longer than
  // max_position_embeddings, which the model refuses, so it computes as
  // default), "llama3" (Llama 3.1's wavelength-dependent scaling) or "yarn"
  // (YaRN, with its attention factor on cos and sin).
  std::string rope_type = "default";
  double factor = 1.0;  // linear, dynamic, llama3, yarn
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

// The factor yarn multiplies cos and sin by, as transformers 5.17's
// _compute_yarn_parameters computes it: attention_factor when given, else
// from factor and the mscales (get_mscale). 1 for the other rope types.
double RopeAttentionFactor(const RopeScaling& r);

// The rope types RopeScaling supports, for messages: "default, linear,
// dynamic, llama3, yarn".
const char* SupportedRopeTypes();

// A model family the daemon implements: transformers' model_type, the
// *ForCausalLM class that config.json's "architectures" names, and what the
// family's config class defaults to where config.json is silent.
// The largest attention factor a config may give or imply: yarn's is 1 to
// about 1.5 on every published model; one of 1e300 makes cos and sin
// infinite in float32.
inline constexpr double kMaxRopeAttentionFactor = 100.0;

struct ModelFamily {
  const char* model_type;    // "llama"
  const char* architecture;  // "LlamaForCausalLM"
  int64_t default_max_position_embeddings;
  int64_t default_head_dim;  // 0: hidden_size / num_attention_heads
};
// llama, mistral, qwen2, qwen3, as transformers 5.17 defines them.
const std::vector<ModelFamily>& ModelFamilies();
// "LlamaForCausalLM, MistralForCausalLM, ...", for messages.
std::string SupportedArchitectures();

// The fields of a transformers Llama-family config (LlamaConfig,
// MistralConfig, Qwen2Config, Qwen3Config) that determine the model's shape
// and numerics. One decoder computes all four; the family decides which
// optional parts a layer has (see qkv_bias() and the others below). A plain
// value type.
struct LlamaConfig {
  static constexpr const char* kArchitecture = "LlamaForCausalLM";

  // One of ModelFamilies(): the class and its model_type agree.
  std::string architecture = kArchitecture;
  std::string model_type = "llama";
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
  // config.json's head_dim when it gives one; 0: the family's default
  // (hidden_size / num_attention_heads; Qwen3: 128).
  int64_t explicit_head_dim = 0;
  bool tie_word_embeddings = false;
  // Llama and Qwen3: biases on q/k/v/o_proj. Llama: biases on the MLP's
  // projections. (Qwen2 always has q/k/v biases and no others; Mistral none.)
  bool attention_bias = false;
  bool mlp_bias = false;
  // Sliding-window attention: a query at position q attends to keys in
  // (q - sliding_window, q]. 0: none (every layer attends to all earlier
  // positions). Mistral applies it to every layer; Qwen2 and Qwen3 to the
  // layers that layer_types names "sliding_attention" (by default those at
  // index >= max_window_layers), and only when use_sliding_window is set, as
  // transformers reads them; the value kept here is the effective one.
  int64_t sliding_window = 0;
  int64_t max_window_layers = 28;  // Qwen2 and Qwen3, written back
  // Qwen2 and Qwen3: "full_attention" or "sliding_attention" per layer, as
  // transformers computes them; empty for Llama and Mistral.
  std::vector<std::string> layer_types;
  // The dtype the weights are stored in ("float32", "bfloat16", "float16").
  // The daemon trains in float32 whatever this says; it is kept for
  // snapshots and config.json.
  std::string torch_dtype = "float32";
  // The keys of the config.json this config was read from that the fields
  // above do not model (token ids such as bos_token_id and eos_token_id,
  // pad_token_id, initializer_range, transformers_version, ...), as a JSON
  // object's text; empty: none (a preset). They never change the model:
  // ToJson writes them back unchanged, so that a snapshot's config.json
  // carries them, and operator== ignores them.
  std::string carried_json;

  // The family's optional parts, from model_type and the flags above.
  bool qkv_bias() const { return model_type == "qwen2" || attention_bias; }
  bool o_bias() const { return attention_bias; }
  bool qk_norm() const { return model_type == "qwen3"; }
  // The window layer `index` attends within; 0: the whole causal past.
  int64_t LayerWindow(int64_t index) const;

  int64_t head_dim() const;

  // Parses a Hugging Face config.json of one of ModelFamilies(). Fields
  // absent from the file take the family's transformers defaults, except
  // the shape fields (vocab_size, hidden_size, intermediate_size,
  // num_hidden_layers, num_attention_heads), which are required.
  // INVALID_ARGUMENT for malformed JSON, a missing or mistyped field, an
  // architecture or model_type of another family (or the two disagreeing),
  // options this implementation does not support (a rope type it does not
  // compute, a partial_rotary_factor, a hidden_act other than silu), and
  // everything Validate() rejects. The rotary settings come from
  // "rope_scaling" when it is set, else from "rope_parameters"
  // (transformers 5), rope_theta from that dict or the top level, as
  // transformers 5.17 reads them.
  static absl::StatusOr<LlamaConfig> FromJson(absl::string_view json);

  // A config.json that transformers' AutoConfig / AutoModelForCausalLM
  // load as the same class with the same settings (architectures,
  // model_type, hidden_act "silu", the family's own fields), pretty
  // printed with an indent of 2, with the rotary settings as transformers
  // 5.17 writes them ("rope_parameters": rope_theta, rope_type and the
  // type's fields), and with every key of carried_json, whose values win
  // over the defaults this writes for keys the model does not depend on
  // (initializer_range, use_cache, pretraining_tp).
  std::string ToJson() const;

  // OK, or INVALID_ARGUMENT saying which field is wrong and how to fix it:
  // an unknown architecture, non-positive sizes, epsilon or theta, a
  // negative sliding_window, sizes whose parameter count overflows int64,
  // more than 2^20 layers, hidden_size % num_attention_heads != 0
  // (transformers' LlamaConfig refuses it even with an explicit head_dim;
  // the other families when head_dim is not given), layer_types of the
  // wrong length, an odd head_dim (rotary embedding needs pairs),
  // num_attention_heads % num_key_value_heads != 0, an unsupported
  // torch_dtype, rope scaling fields out of range (factor < 1, llama3's
  // high_freq_factor <= low_freq_factor, a non-positive
  // original_max_position_embeddings), and settings whose rotary embedding
  // would not be finite: rope_theta below 1, yarn's beta_fast or beta_slow
  // not positive, mscales that are not finite, or an attention factor
  // (given or computed) outside (0, kMaxRopeAttentionFactor].
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
  //   "qwen2.5-0.5b": Qwen2.5-0.5B (Qwen2ForCausalLM: vocabulary 151936,
  //            hidden 896, intermediate 4864, 24 layers, 14 heads, 2
  //            key/value heads, q/k/v biases, 32768 positions, rope_theta
  //            1e6, rms_norm_eps 1e-6, tied head; sliding window off);
  //            494,032,768 parameters.
  //   "smollm2-135m": SmolLM2-135M (LlamaForCausalLM: vocabulary 49152,
  //            hidden 576, intermediate 1536, 30 layers, 9 heads, 3
  //            key/value heads, 8192 positions, rope_theta 100000,
  //            rms_norm_eps 1e-5, tied head); 134,515,008 parameters.
  // INVALID_ARGUMENT listing the known names otherwise.
  static absl::StatusOr<LlamaConfig> Preset(absl::string_view name);
  static std::vector<std::string> PresetNames();

  // The same model: every field but carried_json.
  friend bool operator==(const LlamaConfig& a, const LlamaConfig& b);
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_MODEL_CONFIG_H_

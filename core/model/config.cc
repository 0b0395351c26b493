// LlamaConfig's model: the families, the derived sizes, the one check of a
// config (Validate) and the rotary attention factor. Reading and writing
// config.json: config_json.cc; the built-in models: presets.cc.

#include "core/model/config.h"

#include <cmath>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"
#include "core/model/internal/config_checks.h"

namespace memprofd {
namespace config_internal {
namespace {

// The rope types RotaryInverseFrequencies computes: the one list, for the
// checks and for SupportedRopeTypes()'s message.
constexpr absl::string_view kRopeTypes[] = {"default", "linear", "dynamic", "llama3",
                                            "yarn"};

}  // namespace

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json field \"", field, "\" ", problem));
}

absl::Status Positive(absl::string_view field, int64_t value) {
  if (value <= 0) return FieldError(field, absl::StrCat("must be positive, got ", value));
  return absl::OkStatus();
}

bool IsSupportedRopeType(absl::string_view type) {
  return absl::c_linear_search(kRopeTypes, type);
}

const ModelFamily* FamilyOfArchitecture(absl::string_view architecture) {
  for (const ModelFamily& f : ModelFamilies()) {
    if (architecture == f.architecture) return &f;
  }
  return nullptr;
}

// More decoder layers than any real model has by far; it bounds the
// per-layer lists (layer_types) a config.json can make the daemon build.
constexpr int64_t kMaxHiddenLayers = int64_t{1} << 20;

absl::Status LayerCountWithinLimit(int64_t layers) {
  if (layers > kMaxHiddenLayers) {
    return FieldError(
        "num_hidden_layers",
        absl::StrCat("is ", layers, "; at most ", kMaxHiddenLayers, " are supported"));
  }
  return absl::OkStatus();
}

}  // namespace config_internal

using config_internal::FamilyOfArchitecture;
using config_internal::FieldError;
using config_internal::IsSupportedRopeType;
using config_internal::LayerCountWithinLimit;
using config_internal::Positive;

const std::vector<ModelFamily>& ModelFamilies() {
  static const std::vector<ModelFamily> families = {
      {"llama", "LlamaForCausalLM", 2048, 0},
      {"mistral", "MistralForCausalLM", 131072, 0},
      {"qwen2", "Qwen2ForCausalLM", 32768, 0},
      {"qwen3", "Qwen3ForCausalLM", 32768, 128},
  };
  return families;
}

std::string SupportedArchitectures() {
  std::vector<std::string> names;
  for (const ModelFamily& f : ModelFamilies()) names.push_back(f.architecture);
  return absl::StrJoin(names, ", ");
}

int64_t LlamaConfig::head_dim() const {
  if (explicit_head_dim > 0) return explicit_head_dim;
  return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
}

int64_t LlamaConfig::LayerWindow(int64_t index) const {
  if (sliding_window <= 0) return 0;
  if (model_type == "mistral") return sliding_window;
  if (index >= 0 && index < static_cast<int64_t>(layer_types.size()) &&
      layer_types[static_cast<size_t>(index)] == "sliding_attention") {
    return sliding_window;
  }
  return 0;
}

absl::string_view AttentionImplementationName(AttentionImplementation attention) {
  switch (attention) {
    case AttentionImplementation::kSdpa:
      return "sdpa";
    case AttentionImplementation::kEager:
      return "eager";
  }
  return "unknown";
}

absl::StatusOr<AttentionImplementation> ParseAttentionImplementation(
    absl::string_view name) {
  for (AttentionImplementation a :
       {AttentionImplementation::kSdpa, AttentionImplementation::kEager}) {
    if (name == AttentionImplementationName(a)) return a;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "attn_implementation must be \"sdpa\" or \"eager\", not ", Echo(name)));
}

namespace {

// NumParameters' sum with every product checked: false when it overflows
// int64 (a config.json with hidden_size 2^32 passed every other check and
// made the plain sum signed overflow, found by fuzz/config_fuzz under UBSan).
bool CountParameters(const LlamaConfig& c, int64_t* out) {
  int64_t q_dim, kv_dim, hh, hkv, hi, per_layer, layers, embed, total, biases;
  const bool overflow =
      __builtin_mul_overflow(c.head_dim(), c.num_attention_heads, &q_dim) ||
      __builtin_mul_overflow(c.head_dim(), c.num_key_value_heads, &kv_dim) ||
      __builtin_mul_overflow(c.hidden_size, q_dim, &hh) ||
      __builtin_mul_overflow(hh, int64_t{2}, &hh) ||  // q, o
      __builtin_mul_overflow(c.hidden_size, kv_dim, &hkv) ||
      __builtin_mul_overflow(hkv, int64_t{2}, &hkv) ||  // k, v
      __builtin_mul_overflow(c.hidden_size, c.intermediate_size, &hi) ||
      __builtin_mul_overflow(hi, int64_t{3}, &hi) ||  // gate, up, down
      __builtin_add_overflow(hh, hkv, &per_layer) ||
      __builtin_add_overflow(per_layer, hi, &per_layer) ||
      __builtin_add_overflow(per_layer, 2 * c.hidden_size, &per_layer) ||  // norms
      // q/k/v, o, MLP biases and the q/k norms: sums of sizes already checked
      __builtin_add_overflow(
          (c.qkv_bias() ? q_dim + 2 * kv_dim : 0) + (c.o_bias() ? c.hidden_size : 0) +
              (c.qk_norm() ? 2 * c.head_dim() : 0),
          c.mlp_bias ? 2 * c.intermediate_size + c.hidden_size : 0, &biases) ||
      __builtin_add_overflow(per_layer, biases, &per_layer) ||
      __builtin_mul_overflow(c.num_hidden_layers, per_layer, &layers) ||
      __builtin_mul_overflow(c.vocab_size, c.hidden_size, &embed) ||
      __builtin_mul_overflow(embed, int64_t{c.tie_word_embeddings ? 1 : 2}, &embed) ||
      __builtin_add_overflow(embed, layers, &total) ||
      __builtin_add_overflow(total, c.hidden_size, &total);
  if (overflow) return false;
  *out = total;
  return true;
}

}  // namespace

absl::Status LlamaConfig::Validate() const {
  const ModelFamily* family = FamilyOfArchitecture(architecture);
  if (family == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown architecture ", Echo(architecture),
                     "; supported: ", SupportedArchitectures()));
  }
  if (model_type != family->model_type) {
    return FieldError("model_type",
                      absl::StrCat("is ", Echo(model_type), " but ", architecture,
                                   " is model_type \"", family->model_type, "\""));
  }
  RETURN_IF_ERROR(Positive("vocab_size", vocab_size));
  RETURN_IF_ERROR(Positive("hidden_size", hidden_size));
  RETURN_IF_ERROR(Positive("intermediate_size", intermediate_size));
  RETURN_IF_ERROR(Positive("num_hidden_layers", num_hidden_layers));
  RETURN_IF_ERROR(Positive("num_attention_heads", num_attention_heads));
  RETURN_IF_ERROR(Positive("num_key_value_heads", num_key_value_heads));
  RETURN_IF_ERROR(Positive("max_position_embeddings", max_position_embeddings));
  // transformers' LlamaConfig refuses it even with a head_dim; the others
  // need it only to derive head_dim.
  if (hidden_size % num_attention_heads != 0 &&
      (model_type == "llama" || explicit_head_dim == 0)) {
    return FieldError(
        "hidden_size",
        absl::StrCat("(", hidden_size, ") must be a multiple of num_attention_heads (",
                     num_attention_heads, ")"));
  }
  if (explicit_head_dim < 0) {
    return FieldError("head_dim",
                      absl::StrCat("must be positive, got ", explicit_head_dim));
  }
  if (head_dim() % 2 != 0) {
    return FieldError(
        explicit_head_dim > 0 ? "head_dim" : "hidden_size",
        absl::StrCat(explicit_head_dim > 0 ? "" : "/ num_attention_heads ",
                     "must be even for the rotary embedding, got head_dim ", head_dim()));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return FieldError("num_attention_heads",
                      absl::StrCat("(", num_attention_heads,
                                   ") must be a multiple of num_key_value_heads (",
                                   num_key_value_heads, ")"));
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return FieldError("rms_norm_eps",
                      absl::StrCat("must be positive, got ", rms_norm_eps));
  }
  if (!(rope_theta >= 1) || !std::isfinite(rope_theta)) {
    // Below 1 no model trains (published ones use 1e4 to 1e6), and a base
    // under float32's range makes every rotary frequency infinite.
    return FieldError("rope_theta",
                      absl::StrCat("must be a finite number >= 1, got ", rope_theta));
  }
  if (sliding_window < 0) {
    return FieldError("sliding_window",
                      absl::StrCat("must be positive or null, got ", sliding_window));
  }
  if (!layer_types.empty()) {
    if (static_cast<int64_t>(layer_types.size()) != num_hidden_layers) {
      return FieldError("layer_types",
                        absl::StrCat("has ", layer_types.size(), " entries for ",
                                     num_hidden_layers, " layers; give one per layer"));
    }
    for (const std::string& type : layer_types) {
      if (type != "full_attention" && type != "sliding_attention") {
        return FieldError(
            "layer_types",
            absl::StrCat("holds ", Echo(type),
                         "; use \"full_attention\" or \"sliding_attention\""));
      }
    }
  }
  const RopeScaling& r = rope_scaling;
  if (!IsSupportedRopeType(r.rope_type)) {
    return FieldError(
        "rope_parameters.rope_type",
        absl::StrCat("is \"", r.rope_type, "\"; supported: ", SupportedRopeTypes()));
  }
  if (r.rope_type != "default" && !(r.factor >= 1.0 && std::isfinite(r.factor))) {
    return FieldError("rope_parameters.factor",
                      absl::StrCat("must be a finite number >= 1, got ", r.factor));
  }
  if ((r.rope_type == "llama3" || r.rope_type == "yarn") &&
      r.original_max_position_embeddings <= 0) {
    return FieldError(
        "rope_parameters.original_max_position_embeddings",
        absl::StrCat("must be positive, got ", r.original_max_position_embeddings));
  }
  if (r.rope_type == "llama3" &&
      !(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor &&
        std::isfinite(r.high_freq_factor))) {
    return FieldError("rope_parameters.high_freq_factor",
                      absl::StrCat("(", r.high_freq_factor, ") must be finite and above ",
                                   "low_freq_factor (", r.low_freq_factor,
                                   "), which must be positive"));
  }
  if (r.rope_type == "yarn") {
    const std::pair<const char*, const std::optional<double>*> positive[] = {
        {"beta_fast", &r.beta_fast}, {"beta_slow", &r.beta_slow}};
    for (const auto& [name, value] : positive) {
      // transformers reads 0 (falsy) as its default; below 0 the YaRN ramp's
      // logarithm is not defined.
      if (value->has_value() && !(**value >= 0 && std::isfinite(**value))) {
        return FieldError(absl::StrCat("rope_parameters.", name),
                          absl::StrCat("must be a finite number >= 0, got ", **value));
      }
    }
    const std::pair<const char*, const std::optional<double>*> finite[] = {
        {"mscale", &r.mscale}, {"mscale_all_dim", &r.mscale_all_dim}};
    for (const auto& [name, value] : finite) {
      if (value->has_value() && !std::isfinite(**value)) {
        return FieldError(absl::StrCat("rope_parameters.", name),
                          absl::StrCat("must be finite, got ", **value));
      }
    }
    const double attention = RopeAttentionFactor(r);
    if (!(attention > 0 && attention <= kMaxRopeAttentionFactor)) {
      return FieldError(
          r.attention_factor ? "rope_parameters.attention_factor"
                             : "rope_parameters.mscale",
          absl::StrCat("gives an attention factor of ", attention,
                       " on cos and sin; it must be in (0, ", kMaxRopeAttentionFactor,
                       "] (published YaRN models use 1 to about 1.5)"));
    }
  }
  if (torch_dtype != "float32" && torch_dtype != "bfloat16" && torch_dtype != "float16") {
    return FieldError(
        "torch_dtype",
        absl::StrCat("is \"", torch_dtype, "\"; use float32, bfloat16 or float16"));
  }
  if (int64_t n; !CountParameters(*this, &n)) {
    return FieldError("hidden_size",
                      absl::StrCat("(", hidden_size, ") with intermediate_size (",
                                   intermediate_size, "), vocab_size (", vocab_size,
                                   ") and num_hidden_layers (", num_hidden_layers,
                                   ") gives more than 2^63 parameters; check the sizes"));
  }
  RETURN_IF_ERROR(LayerCountWithinLimit(num_hidden_layers));
  return absl::OkStatus();
}

double RopeAttentionFactor(const RopeScaling& r) {
  if (r.rope_type != "yarn") return 1.0;
  if (r.attention_factor.has_value()) return *r.attention_factor;
  auto get_mscale = [](double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
  };
  if (r.mscale.value_or(0) != 0 && r.mscale_all_dim.value_or(0) != 0) {
    return get_mscale(r.factor, *r.mscale) / get_mscale(r.factor, *r.mscale_all_dim);
  }
  return get_mscale(r.factor, 1.0);
}

const char* SupportedRopeTypes() {
  static const std::string names = absl::StrJoin(config_internal::kRopeTypes, ", ");
  return names.c_str();
}

bool operator==(const RopeScaling& a, const RopeScaling& b) {
  return a.rope_type == b.rope_type && a.factor == b.factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings &&
         a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.attention_factor == b.attention_factor && a.beta_fast == b.beta_fast &&
         a.beta_slow == b.beta_slow && a.mscale == b.mscale &&
         a.mscale_all_dim == b.mscale_all_dim && a.truncate == b.truncate;
}

int64_t LlamaConfig::NumParameters() const {
  int64_t n = 0;
  return CountParameters(*this, &n) ? n : -1;
}

bool operator==(const LlamaConfig& a, const LlamaConfig& b) {
  return a.architecture == b.architecture && a.model_type == b.model_type &&
         a.attention_bias == b.attention_bias && a.mlp_bias == b.mlp_bias &&
         a.sliding_window == b.sliding_window &&
         a.max_window_layers == b.max_window_layers && a.layer_types == b.layer_types &&
         a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
         a.rope_scaling == b.rope_scaling && a.head_dim() == b.head_dim() &&
         a.tie_word_embeddings == b.tie_word_embeddings && a.torch_dtype == b.torch_dtype;
}

}  // namespace memprofd

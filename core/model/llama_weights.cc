// LlamaModel's weights: the Hugging Face names of every parameter (one
// table, kLayerParameters, for a decoder layer, filtered by the config), their
// initialisation, their placement on the device, the CPU or disk, and loading a state
// dict.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/model/internal/tensor_text.h"
#include "core/model/llama.h"

namespace memprofd {
namespace {

using model_internal::ShapeString;

constexpr double kInitStd = 0.02;  // transformers' initializer_range

// A rotary embedding's inverse frequencies, which transformers keeps as a
// non-persistent buffer and older versions saved per layer
// ("model.layers.0.self_attn.rotary_emb.inv_freq"); transformers ignores
// such keys on load (modeling_utils' _adjust_missing_and_unexpected_keys
// matches "rotary_emb\.inv_freq"), and the model computes them from the
// config.
bool IsRotaryBufferKey(absl::string_view name) {
  return absl::StrContains(name, "rotary_emb.inv_freq");
}

// Why `name` is not a parameter of `config`'s model, pointing at the likely
// cause: a decoder layer past num_hidden_layers (the weights belong to a
// deeper config), a part the family's flags leave out (a bias, a q/k norm),
// or a tensor no Llama-family model of this kind has.
absl::Status UnknownKeyError(const std::string& name, const LlamaConfig& config) {
  constexpr absl::string_view kLayers = "model.layers.";
  if (absl::StartsWith(name, kLayers)) {
    const absl::string_view rest = absl::string_view(name).substr(kLayers.size());
    int64_t index = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &index) &&
        index >= config.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the weights hold \"", name, "\", of decoder layer ", index,
          ", but config.json's num_hidden_layers is ", config.num_hidden_layers,
          "; the weights belong to a deeper model: use its config.json"));
    }
    if (absl::EndsWith(name, ".bias") || absl::StrContains(name, "_norm.")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the weights hold \"", name, "\", which a ", config.architecture,
          " with this config.json does not have (model_type \"", config.model_type,
          "\", attention_bias ", config.attention_bias ? "true" : "false", ", mlp_bias ",
          config.mlp_bias ? "true" : "false",
          "); check those fields against the model the weights came from"));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "the weights hold \"", name, "\", which is neither a parameter of a ",
      config.architecture,
      " nor a buffer transformers ignores; the weights may be of another architecture "
      "or carry extra tensors: save them with transformers' save_pretrained"));
}

// inv_freq [head_dim / 2] (float32, CPU) and the factor cos and sin are
// multiplied by, for config's rope type, in the order of operations of
// transformers 5.17's modeling_rope_utils (_compute_*_parameters), so that
// the float32 values are the same.
at::Tensor RotaryInverseFrequencies(const LlamaConfig& c, double* attention_factor) {
  const RopeScaling& r = c.rope_scaling;
  const int64_t dim = c.head_dim();
  const double base = c.rope_theta;
  *attention_factor = 1.0;
  at::Tensor exponents =
      torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / dim;
  if (r.rope_type == "yarn") {
    const double factor = r.factor;
    *attention_factor = RopeAttentionFactor(r);
    // transformers: `get("beta_fast") or 32`, so 0 means the default too.
    const double beta_fast = r.beta_fast.value_or(0) != 0 ? *r.beta_fast : 32.0;
    const double beta_slow = r.beta_slow.value_or(0) != 0 ? *r.beta_slow : 1.0;
    const double original = static_cast<double>(r.original_max_position_embeddings);
    auto correction_dim = [&](double rotations) {
      return (dim * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(base));
    };
    double low = correction_dim(beta_fast);
    double high = correction_dim(beta_slow);
    if (r.truncate.value_or(true)) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    at::Tensor pos_freqs = torch::pow(base, exponents);
    at::Tensor extrapolation = 1.0 / pos_freqs;
    at::Tensor interpolation = 1.0 / (factor * pos_freqs);
    at::Tensor ramp = torch::clamp(
        (torch::arange(dim / 2, torch::kFloat32) - low) / (high - low), 0, 1);
    at::Tensor extrapolation_factor = 1 - ramp;
    return interpolation * (1 - extrapolation_factor) +
           extrapolation * extrapolation_factor;
  }
  at::Tensor inv_freq = 1.0 / torch::pow(base, exponents);
  if (r.rope_type == "linear") return inv_freq / r.factor;
  if (r.rope_type == "llama3") {
    const double old_context = static_cast<double>(r.original_max_position_embeddings);
    const double low_wavelen = old_context / r.low_freq_factor;
    const double high_wavelen = old_context / r.high_freq_factor;
    at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled =
        torch::where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq);
    at::Tensor smooth = (old_context / wavelen - r.low_freq_factor) /
                        (r.high_freq_factor - r.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
    at::Tensor medium = wavelen.ge(high_wavelen).logical_and(wavelen.le(low_wavelen));
    return torch::where(medium, smoothed, scaled);
  }
  return inv_freq;
}

}  // namespace

at::Tensor LlamaModel::Fetch(const at::Tensor& t) const {
  return t.device() == device_ ? t : t.to(device_, /*non_blocking=*/false);
}

std::vector<std::pair<std::string, at::Tensor*>> LlamaModel::ModuleSlots(
    const std::string& module) {
  std::vector<std::pair<std::string, at::Tensor*>> slots;
  if (module == "model.embed_tokens") {
    slots.emplace_back("model.embed_tokens.weight", &embed_tokens_);
  } else if (module == "model.norm") {
    slots.emplace_back("model.norm.weight", &norm_);
  } else if (module == "lm_head") {
    slots.emplace_back("lm_head.weight", &lm_head_);
  } else if (absl::StartsWith(module, "model.layers.")) {
    int64_t i = -1;
    if (!absl::SimpleAtoi(module.substr(sizeof("model.layers.") - 1), &i) || i < 0 ||
        i >= num_layers()) {
      return slots;
    }
    LlamaLayerWeights& w = layers_[static_cast<size_t>(i)];
    for (const LayerParameter& param : layer_parameters_) {
      slots.emplace_back(absl::StrCat(module, ".", param.name), &(w.*param.member));
    }
  }
  return slots;
}

absl::Status LlamaModel::PlaceModule(
    const std::string& module, Placement placement,
    const std::vector<std::pair<std::string, at::Tensor>>& weights) {
  if (module == "lm_head" && config_.tie_word_embeddings) {
    return absl::InvalidArgumentError(
        "lm_head is tied to model.embed_tokens in this model; place model.embed_tokens "
        "and "
        "the head follows it");
  }
  std::vector<std::pair<std::string, at::Tensor*>> slots = ModuleSlots(module);
  if (slots.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no module '", module, "' in this ", num_layers(),
                     "-layer model; use model.embed_tokens, model.layers.0..",
                     num_layers() - 1, ", model.norm or lm_head"));
  }
  const c10::Device home =
      placement == Placement::kDevice ? device_ : c10::Device(c10::DeviceType::CPU);
  std::vector<at::Tensor> bound;
  for (const auto& [name, slot] : slots) {
    auto it = std::find_if(weights.begin(), weights.end(),
                           [&name = name](const auto& w) { return w.first == name; });
    if (it == weights.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("placing ", module, " needs \"", name, "\""));
    }
    const at::Tensor& t = it->second;
    if (!t.defined() || t.sizes() != slot->sizes() || t.scalar_type() != base_dtype_ ||
        t.device() != home) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placing ", module, ": \"", name, "\" must be a ", c10::toString(base_dtype_),
          " ", home.str(), " tensor of shape ", ShapeString(*slot)));
    }
    if (placement == Placement::kDisk && base_dtype_ != at::kFloat) {
      return absl::FailedPreconditionError(absl::StrCat(
          "placing ", module,
          " on disk: a bf16 base stays on the device or cpu (disk placement maps "
          "float32 weights)"));
    }
    bound.push_back(t.detach().requires_grad_(placement != Placement::kDisk &&
                                              !lora_.has_value() &&
                                              base_dtype_ == at::kFloat));
  }
  for (size_t i = 0; i < slots.size(); ++i) *slots[i].second = bound[i];
  if (module == "model.embed_tokens" && config_.tie_word_embeddings)
    lm_head_ = embed_tokens_;
  if (placement == Placement::kDevice) {
    placement_.erase(module);
  } else {
    placement_[module] = placement;
  }
  return absl::OkStatus();
}

Placement LlamaModel::PlacementOf(const std::string& module) const {
  if (module == "lm_head" && config_.tie_word_embeddings) {
    return PlacementOf("model.embed_tokens");
  }
  auto it = placement_.find(module);
  return it == placement_.end() ? Placement::kDevice : it->second;
}

void LlamaModel::Initialize(uint64_t seed) {
  torch::NoGradGuard no_grad;
  const LlamaConfig& c = config_;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto cpu = torch::TensorOptions().dtype(torch::kFloat32);
  // The weights in the base's dtype: a bf16 base is frozen (it trains
  // adapters only) and holds the float32 draws rounded, one tensor at a time.
  const auto home = torch::TensorOptions().dtype(base_dtype_).device(device_);
  const bool trainable = base_dtype_ == at::kFloat;
  // On the meta device (a dry run, core/plan) there is nothing to draw: a
  // 70B shape's weights are never made on the CPU.
  auto normal = [&](std::vector<int64_t> shape) {
    if (device_.is_meta()) return at::empty(shape, home).requires_grad_(trainable);
    return at::normal(0.0, kInitStd, shape, gen, cpu)
        .to(device_, base_dtype_)
        .requires_grad_(trainable);
  };
  auto ones = [&](int64_t n) { return torch::ones({n}, home).requires_grad_(trainable); };
  // transformers zeroes Linear biases; they draw nothing, so a model without
  // them gets the same weights from a seed as before they existed.
  auto zeros_if = [&](bool present, int64_t n) {
    return present ? torch::zeros({n}, home).requires_grad_(trainable) : at::Tensor();
  };
  const int64_t h = c.hidden_size;
  const int64_t q_dim = c.num_attention_heads * c.head_dim();
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim();
  const int64_t inter = c.intermediate_size;

  // Drawn in state_dict order so that the init is a function of the seed.
  embed_tokens_ = normal({c.vocab_size, h});
  layers_.resize(c.num_hidden_layers);
  for (LlamaLayerWeights& w : layers_) {
    w.q_proj = normal({q_dim, h});
    w.k_proj = normal({kv_dim, h});
    w.v_proj = normal({kv_dim, h});
    w.o_proj = normal({h, q_dim});
    w.gate_proj = normal({inter, h});
    w.up_proj = normal({inter, h});
    w.down_proj = normal({h, inter});
    w.input_layernorm = ones(h);
    w.post_attention_layernorm = ones(h);
    w.q_bias = zeros_if(c.qkv_bias(), q_dim);
    w.k_bias = zeros_if(c.qkv_bias(), kv_dim);
    w.v_bias = zeros_if(c.qkv_bias(), kv_dim);
    w.o_bias = zeros_if(c.o_bias(), h);
    w.gate_bias = zeros_if(c.mlp_bias, inter);
    w.up_bias = zeros_if(c.mlp_bias, inter);
    w.down_bias = zeros_if(c.mlp_bias, h);
    if (c.qk_norm()) {
      w.q_norm = ones(c.head_dim());
      w.k_norm = ones(c.head_dim());
    }
  }
  norm_ = ones(h);
  lm_head_ = c.tie_word_embeddings ? embed_tokens_ : normal({c.vocab_size, h});

  if (device_.is_meta()) {
    // Shapes only (a dry run): max_position_embeddings can be 128K.
    rope_cos_ = at::empty({c.max_position_embeddings, c.head_dim()}, cpu.device(device_));
    rope_sin_ = at::empty({c.max_position_embeddings, c.head_dim()}, cpu.device(device_));
    return;
  }
  // transformers' LlamaRotaryEmbedding, in float32 as it computes it:
  // angle = position * inv_freq, cos and sin times the attention factor.
  double attention_factor = 1.0;
  at::Tensor inv_freq = RotaryInverseFrequencies(c, &attention_factor);
  at::Tensor positions =
      torch::arange(c.max_position_embeddings, torch::kInt64).to(torch::kFloat32);
  at::Tensor freqs = torch::outer(positions, inv_freq);
  at::Tensor emb = torch::cat({freqs, freqs}, -1);
  if (attention_factor != 1.0) {
    rope_cos_ = (emb.cos() * attention_factor).to(device_);
    rope_sin_ = (emb.sin() * attention_factor).to(device_);
    return;
  }
  rope_cos_ = emb.cos().to(device_);
  rope_sin_ = emb.sin().to(device_);
}

namespace {

// Layer `index`'s adapters (those defined), named as NamedAdapters names
// them.
void AppendLayerAdapters(const LlamaLayerLora& lora, size_t index,
                         std::vector<std::pair<std::string, at::Tensor>>* out) {
  for (const LoraTarget& target : kLoraTargets) {
    const LoraPair& pair = lora.*target.pair;
    if (!pair.a.defined()) continue;
    const std::string module = absl::StrCat("model.layers.", index, ".", target.module);
    out->emplace_back(absl::StrCat(module, ".lora_A.weight"), pair.a);
    out->emplace_back(absl::StrCat(module, ".lora_B.weight"), pair.b);
  }
}

}  // namespace

std::vector<at::Tensor> LlamaModel::LayerParameters(int64_t index) const {
  const LlamaLayerWeights& w = layers_.at(index);
  std::vector<at::Tensor> out;
  out.reserve(layer_parameters_.size());
  for (const LayerParameter& param : layer_parameters_) out.push_back(w.*param.member);
  if (!lora_layers_.empty()) {
    std::vector<std::pair<std::string, at::Tensor>> adapters;
    AppendLayerAdapters(lora_layers_.at(static_cast<size_t>(index)),
                        static_cast<size_t>(index), &adapters);
    for (auto& [name, t] : adapters) out.push_back(t);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::NamedParameters() const {
  return Named(/*with_adapters=*/true);
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::NamedBaseParameters() const {
  return Named(/*with_adapters=*/false);
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::Named(
    bool with_adapters) const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(3 + layer_parameters_.size() * layers_.size());
  out.emplace_back("model.embed_tokens.weight", embed_tokens_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LlamaLayerWeights& w = layers_[i];
    for (const LayerParameter& param : layer_parameters_) {
      out.emplace_back(absl::StrCat("model.layers.", i, ".", param.name),
                       w.*param.member);
    }
    if (with_adapters && !lora_layers_.empty()) {
      AppendLayerAdapters(lora_layers_[i], i, &out);
    }
  }
  out.emplace_back("model.norm.weight", norm_);
  out.emplace_back("lm_head.weight", lm_head_);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::NamedAdapters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < lora_layers_.size(); ++i) {
    AppendLayerAdapters(lora_layers_[i], i, &out);
  }
  return out;
}

std::vector<at::Tensor> LlamaModel::Parameters() const {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : NamedParameters()) {
    if (name == "lm_head.weight" && config_.tie_word_embeddings) continue;
    out.push_back(t);
  }
  return out;
}

std::vector<at::Tensor> LlamaModel::Buffers() const { return {rope_cos_, rope_sin_}; }

int64_t LlamaModel::NumParameters() const {
  int64_t n = 0;
  for (const at::Tensor& t : Parameters()) n += t.numel();
  return n;
}

absl::Status LlamaModel::LoadStateDict(
    const std::vector<std::pair<std::string, at::Tensor>>& state, int64_t* ignored) {
  std::map<std::string, at::Tensor> params;
  for (auto& [name, t] : NamedBaseParameters()) params.emplace(name, t);
  const bool tied = config_.tie_word_embeddings;

  std::set<std::string> seen;
  int64_t skipped = 0;
  for (const auto& [name, t] : state) {
    if (IsRotaryBufferKey(name)) {
      ++skipped;
      continue;
    }
    auto it = params.find(name);
    if (it == params.end()) return UnknownKeyError(name, config_);
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict holds \"", name, "\" twice; keep one"));
    }
    if (!t.defined() || t.sizes() != it->second.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state dict tensor \"", name, "\" has shape ",
          t.defined() ? ShapeString(t) : "(undefined)", " but the model expects ",
          ShapeString(it->second), "; check that the weights match the config"));
    }
    if (!t.is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state dict tensor \"", name, "\" has dtype ", std::string(t.dtype().name()),
          "; expected a floating-point dtype"));
    }
  }
  std::vector<std::string> missing;
  for (const auto& [name, t] : params) {
    if (seen.count(name)) continue;
    if (tied && name == "lm_head.weight") continue;
    missing.push_back(name);
  }
  if (!missing.empty()) {
    if (missing.size() > 5) {
      missing.resize(5);
      missing.push_back("...");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("state dict lacks ", absl::StrJoin(missing, ", "),
                     "; give every parameter of the model"));
  }
  // Weights placed on disk view a read-only memory-mapped file.
  for (const auto& [name, t] : state) {
    if (PlacementOf(ModuleOfParameter(name)) == Placement::kDisk) {
      return absl::FailedPreconditionError(
          absl::StrCat("\"", name, "\" belongs to ", ModuleOfParameter(name),
                       ", which is memory-mapped from disk and frozen; load the model "
                       "again instead of copying weights into it"));
    }
  }
  if (ignored != nullptr) *ignored = skipped;
  return TorchBoundary("loading the state dict", [&] {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : state) {
      if ((tied && name == "lm_head.weight") || IsRotaryBufferKey(name)) continue;
      params.at(name).copy_(t);
    }
  });
}

}  // namespace memprofd

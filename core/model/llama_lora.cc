// LlamaModel's LoRA side: the fingerprint of the frozen base, the adapters
// (added as peft initialises them, loaded, listed for a merge), and the
// dtype the frozen base is kept in.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/fnv1a.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/model/internal/tensor_text.h"
#include "core/model/llama.h"

namespace memprofd {

using model_internal::ShapeString;

std::string LlamaModel::BaseFingerprint() const {
  constexpr int64_t kSamples = 256;
  uint64_t h = kFnv1aOffsetBasis;
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : NamedBaseParameters()) {
    Fnv1a(name.data(), name.size() + 1, &h);
    for (int64_t d : t.sizes()) Fnv1a(&d, sizeof d, &h);
    const int64_t n = t.numel();
    if (n == 0 || t.is_meta()) continue;
    const at::Tensor positions =
        at::linspace(0, static_cast<double>(n - 1), std::min(n, kSamples),
                     at::TensorOptions().dtype(at::kDouble))
            .to(at::kLong)
            .to(t.device());
    // Rounded to bf16: a base kept in bf16 (SetBaseDtype) has the
    // fingerprint of the float32 base it was cast from.
    const at::Tensor values = t.detach()
                                  .reshape({-1})
                                  .index_select(0, positions)
                                  .to(at::kCPU, at::kBFloat16)
                                  .contiguous();
    Fnv1a(values.data_ptr(), values.nbytes(), &h);
  }
  return absl::StrFormat("%016x", h);
}

absl::Status LlamaModel::CheckBaseFingerprint(const std::string& recorded,
                                              absl::string_view whose) const {
  const std::string here = BaseFingerprint();
  if (here == recorded) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      whose, " trained on another base (fingerprint ", recorded,
      "; the base loaded now: ", here,
      "): load them onto the base they trained on, which adapter_config.json's "
      "base_model_name_or_path names (the same weights, or the same config and seed "
      "for freshly initialised ones)"));
}

std::vector<AdaptedProjection> LlamaModel::AdaptedProjections() const {
  std::vector<AdaptedProjection> out;
  for (size_t i = 0; i < lora_layers_.size(); ++i) {
    for (const LoraTarget& target : kLoraTargets) {
      const LoraPair& pair = lora_layers_[i].*target.pair;
      if (!pair.a.defined()) continue;
      const std::string weight = absl::StrCat(target.module, ".weight");
      for (const LayerParameter& param : layer_parameters_) {
        if (weight != param.name) continue;
        out.push_back({absl::StrCat("model.layers.", i, ".", weight),
                       layers_[i].*param.member, pair});
        break;
      }
    }
  }
  return out;
}

absl::Status LlamaModel::LoadAdapters(
    const std::vector<std::pair<std::string, at::Tensor>>& adapters) {
  if (!lora_) {
    return absl::FailedPreconditionError("the model has no LoRA adapters to load into");
  }
  std::map<std::string, at::Tensor> own;
  for (auto& [name, t] : NamedAdapters()) own.emplace(name, t);
  std::set<std::string> seen;
  for (const auto& [name, t] : adapters) {
    auto it = own.find(name);
    if (it == own.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adapter tensor \"", name, "\" is not an adapter of this model (r ", lora_->r,
          " on ", LoraTargetsName(lora_->Targets()), ", ", num_layers(), " layers)"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("adapter tensor \"", name, "\" twice"));
    }
    if (!t.defined() || !t.is_floating_point() || t.sizes() != it->second.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adapter tensor \"", name, "\" must be a floating-point tensor of shape ",
          ShapeString(it->second), ", got ",
          t.defined() ? ShapeString(t) : "(undefined)"));
    }
  }
  for (const auto& [name, t] : own) {
    if (!seen.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the adapter lacks \"", name, "\"; give every adapter tensor"));
    }
  }
  return TorchBoundary("loading the adapters", [&] {
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : adapters) own.at(name).copy_(t);
  });
}

absl::Status LlamaModel::AddLora(const LoraOptions& options, uint64_t seed) {
  if (lora_) {
    return absl::FailedPreconditionError(
        "the model has LoRA adapters already; load the model again for other ones");
  }
  RETURN_IF_ERROR(ValidateLoraOptions(options));
  std::vector<LlamaLayerLora> layers(layers_.size());
  RETURN_IF_ERROR(TorchBoundary("adding LoRA adapters", [&] {
    torch::NoGradGuard no_grad;
    at::Generator gen = at::detail::createCPUGenerator(seed);
    const auto cpu = torch::TensorOptions().dtype(torch::kFloat32);
    const std::vector<std::string> targets = options.Targets();
    for (size_t index = 0; index < layers.size(); ++index) {
      LlamaLayerLora& layer = layers[index];
      for (size_t t = 0; t < std::size(kLoraTargets); ++t) {
        const LoraTarget& target = kLoraTargets[t];
        if (std::find(targets.begin(), targets.end(), target.name) == targets.end()) {
          continue;
        }
        const auto [out, in] = ProjectionShape(config_, target.name);
        LoraPair& pair = layer.*target.pair;
        pair.key = index * 8 + t;
        if (device_.is_meta()) {
          pair.a = at::empty({options.r, in}, cpu.device(device_));
        } else {
          // kaiming_uniform_(a=sqrt(5)) on [r, in]: gain sqrt(2 / (1 + 5)),
          // bound gain * sqrt(3 / in) = 1 / sqrt(in).
          const double bound = 1.0 / std::sqrt(static_cast<double>(in));
          pair.a =
              at::empty({options.r, in}, cpu).uniform_(-bound, bound, gen).to(device_);
        }
        pair.b = torch::zeros({out, options.r}, cpu.device(device_));
        pair.a.requires_grad_(true);
        pair.b.requires_grad_(true);
      }
    }
  }));
  lora_layers_ = std::move(layers);
  lora_ = options;
  // The base is frozen: what autograd saves of it (the weights, for the
  // inputs' gradients) are parameters for the offloader, never copied.
  for (auto& [name, t] : NamedBaseParameters()) t.requires_grad_(false);
  return absl::OkStatus();
}

absl::Status LlamaModel::CheckBaseDtype(at::ScalarType dtype) const {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a base is kept in float32 or bfloat16, not ", c10::toString(dtype)));
  }
  if (dtype == base_dtype_) return absl::OkStatus();
  if (dtype == at::kFloat) {
    return absl::FailedPreconditionError(
        "the model's frozen base is bf16 (LoadModel's or an earlier run's base_dtype), "
        "and its rounding cannot be undone: give base_dtype bf16 to train its adapters, "
        "or load "
        "the model again for a float32 base");
  }
  for (const auto& [module, placement] : placement_) {
    if (placement == Placement::kDisk) {
      return absl::FailedPreconditionError(absl::StrCat(
          "base_dtype bf16: ", module,
          " is placed on disk, where its weights stay a read-only mapping of float32; "
          "keep base_dtype float32, or load the model with it on the device or cpu"));
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::SetBaseDtype(at::ScalarType dtype, bool* changed) {
  if (changed != nullptr) *changed = false;
  RETURN_IF_ERROR(CheckBaseDtype(dtype));
  if (dtype == at::kFloat) return absl::OkStatus();  // float32 already
  if (!lora_) {
    return absl::FailedPreconditionError(
        "only a frozen base (under LoRA adapters) is kept in bf16: every weight of a "
        "full fine-tune trains in float32");
  }
  std::vector<std::string> modules = {"model.embed_tokens"};
  for (int64_t i = 0; i < num_layers(); ++i) {
    modules.push_back(absl::StrCat("model.layers.", i));
  }
  modules.push_back("model.norm");
  if (!config_.tie_word_embeddings) modules.push_back("lm_head");
  // The model is bf16 from the first cast on: a cast stopped part way (out of
  // memory) is finished by the next call, never undone.
  base_dtype_ = dtype;
  const absl::Status cast = TorchBoundary("casting the frozen base", [&] {
    torch::NoGradGuard no_grad;
    for (const std::string& module : modules) {
      for (auto& [name, slot] : ModuleSlots(module)) {
        if (!slot->defined() || slot->scalar_type() == dtype) continue;
        *slot = slot->to(dtype);
        if (changed != nullptr) *changed = true;
      }
    }
  });
  if (config_.tie_word_embeddings) lm_head_ = embed_tokens_;
  return cast;
}

}  // namespace memprofd

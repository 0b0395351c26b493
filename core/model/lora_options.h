#ifndef MEMPROFD_CORE_MODEL_LORA_OPTIONS_H_
#define MEMPROFD_CORE_MODEL_LORA_OPTIONS_H_

// What a LoRA fine-tune adapts (peft's LoraConfig: r, lora_alpha,
// target_modules, use_rslora). Plain values, free of LibTorch, for the
// training options; the adapters themselves are lora.h's.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

struct LoraOptions {
  // The adapter's rank (peft's r); 0: no adapters (a full fine-tune).
  int64_t r = 0;
  // peft's lora_alpha.
  double alpha = 8.0;
  // Projection names (kLoraTargets: q_proj, k_proj, v_proj, o_proj,
  // gate_proj, up_proj, down_proj), or {"all-linear"}: every one of them
  // (peft's all-linear leaves the output layer out, as here). The default
  // is peft's for the Llama family.
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  bool use_rslora = false;
  // peft's lora_dropout: the probability that an element of an adapter's
  // input is zeroed (the rest scaled by 1 / (1 - dropout)) in a training
  // step; never in an evaluation. In [0, 1).
  double dropout = 0.0;

  // What B(A(x)) is multiplied by.
  double Scaling() const;
  // The targets as kLoraTargets names, in kLoraTargets order.
  std::vector<std::string> Targets() const;

  // The same adapters: the same targets however spelled ("all-linear" or
  // the names, in any order).
  bool operator==(const LoraOptions& o) const {
    return r == o.r && alpha == o.alpha && Targets() == o.Targets() &&
           use_rslora == o.use_rslora && dropout == o.dropout;
  }
  bool operator!=(const LoraOptions& o) const { return !(*this == o); }
};

inline constexpr int64_t kMaxLoraRank = 4096;

// The dtype a LoRA run keeps its frozen base weights in. Adapters, their
// gradients and AdamW state stay float32 either way. kBf16 halves the base's
// bytes and needs bf16 autocast (mixed_precision bf16): the step then
// computes exactly as a float32 base whose weights were rounded to bf16
// would, the residual stream staying float32.
enum class BaseDtype {
  kFloat32 = 0,
  kBf16 = 1,
};
// "float32", "bf16".
absl::string_view BaseDtypeName(BaseDtype dtype);
// INVALID_ARGUMENT naming base_dtype and the names it takes.
absl::StatusOr<BaseDtype> ParseBaseDtype(absl::string_view name);

// INVALID_ARGUMENT naming the field: r outside [1, kMaxLoraRank]; alpha not
// finite and > 0; dropout outside [0, 1); no targets, an unknown or repeated
// one, "all-linear" beside others.
absl::Status ValidateLoraOptions(const LoraOptions& options);

// The request's spelling of target_modules: names joined by commas
// ("q_proj,v_proj", "all-linear"). Parse keeps the names as given (checked
// by ValidateLoraOptions); INVALID_ARGUMENT for an empty name or more than
// kMaxLoraTargets names.
inline constexpr size_t kMaxLoraTargets = 32;
absl::StatusOr<std::vector<std::string>> ParseLoraTargets(const std::string& text);
std::string LoraTargetsName(const std::vector<std::string>& targets);

// peft's adapter_config.json for adapters of `options` on `base_model`
// (base_model_name_or_path): peft_type LORA, task_type CAUSAL_LM, r,
// lora_alpha, lora_dropout, target_modules (the resolved names), bias
// "none", use_rslora, and the defaults of the LoRA features memprofd does not
// use (DoRA, fan_in_fan_out, modules_to_save). "adapter_model.safetensors"
// beside it holds PeftAdapterName's names.
std::string AdapterConfigJson(const LoraOptions& options, const std::string& base_model);
// The key peft saves an adapter tensor under: "base_model.model." + `name`
// (LlamaModel::NamedAdapters's name).
std::string PeftAdapterName(const std::string& name);

// The options of a peft adapter_config.json (`json`): peft_type LORA, r,
// lora_alpha (default 8), target_modules (names of the projections, a list
// or one string, or "all-linear"), use_rslora, lora_dropout (default 0).
// INVALID_ARGUMENT naming the key for what memprofd does not compute:
// another peft_type, use_dora, a bias other than "none", fan_in_fan_out,
// modules_to_save, layers_to_transform, rank_pattern or alpha_pattern, a
// target that is not a projection name; or for options ValidateLoraOptions
// refuses. `notes` takes what the caller should say about the adapter.
absl::StatusOr<LoraOptions> LoraOptionsFromAdapterConfig(const std::string& json,
                                                         std::vector<std::string>* notes);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_MODEL_LORA_OPTIONS_H_

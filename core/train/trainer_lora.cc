// Trainer's LoRA side: the adapters a run adds, and the dtype it keeps the
// frozen base in (Trainer::AddAdapters).

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/train/memory_tags.h"
#include "core/train/trainer.h"

namespace memprofd {

absl::Status Trainer::AddAdapters(const TrainOptions& options) {
  auto describe = [](const LoraOptions& o) {
    return absl::StrCat("r ", o.r, ", alpha ", o.alpha, ", targets ",
                        LoraTargetsName(o.target_modules),
                        o.use_rslora ? ", rslora" : "");
  };
  const std::optional<LoraOptions>& has = model_->lora();
  const bool add = options.lora.r != 0 && !has;
  if (options.lora.r != 0 && has && *has != options.lora) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the model has LoRA adapters (", describe(*has), ") and this run asks for ",
        describe(options.lora),
        ": leave the lora fields unset (or give the same) to train the model's adapters, "
        "or load the model again for new ones"));
  }
  if (add && (optimizer_ != nullptr || global_step_ > 0)) {
    return absl::FailedPreconditionError(
        "this model has trained every parameter already; load it again to fine-tune it "
        "with LoRA adapters");
  }
  // The base's dtype: every refusal before the model changes.
  const at::ScalarType base = ScalarTypeOf(options.base_dtype);
  if (!has && !add && model_->base_dtype() != at::kFloat) {
    return absl::FailedPreconditionError(
        "the model's base is bf16 (LoadModel's base_dtype): it is frozen and trains LoRA "
        "adapters only; give lora_r (and the other lora fields) with base_dtype bf16, or "
        "load the model in float32 for a full fine-tune");
  }
  if (!has && !add && base != at::kFloat) {
    return absl::FailedPreconditionError(
        "base_dtype bf16 keeps a LoRA run's frozen base in bf16, and this run trains "
        "every parameter: give lora_r (and the other lora fields), or leave base_dtype "
        "float32");
  }
  if (base != model_->base_dtype()) RETURN_IF_ERROR(model_->CheckBaseDtype(base));
  if (add) RETURN_IF_ERROR(model_->AddLora(options.lora, options.seed));
  bool cast = false;
  const absl::Status casting = model_->SetBaseDtype(base, &cast);
  // The base is frozen now and the adapters are new parameters (and a cast
  // base's tensors new ones, even when the cast stopped part way): breakdowns
  // show them apart, and the adapters' gradients as gradients.
  if (add || cast) TagModelMemory(*model_);
  return casting;
}

}  // namespace memprofd

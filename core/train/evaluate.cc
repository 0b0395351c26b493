#include "core/train/evaluate.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/model/llama.h"
#include "core/train/autocast.h"
#include "core/train/chunked_loss.h"
#include "core/train/data.h"

namespace memprofd {

int64_t EvalWindows(const TokenDataset& data, const EvalOptions& o) {
  if (o.seq_len < 1 || data.size() < o.seq_len + 1) return 0;
  const int64_t windows = (data.size() - 1) / o.seq_len;
  return o.max_batches > 0 ? std::min(windows, o.max_batches * o.batch_size) : windows;
}

int64_t EvalBatches(const TokenDataset& data, const EvalOptions& o) {
  return o.batch_size > 0 ? (EvalWindows(data, o) + o.batch_size - 1) / o.batch_size : 0;
}

namespace {

// One batch's summed loss: the model's forward unit by unit, `units` (if
// any) around each, as the trainer's forward is. The head under autocast, as
// in training; the loss is float32 (as transformers' ForCausalLMLoss upcasts
// the logits) either way.
absl::StatusOr<at::Tensor> ForwardLoss(const LlamaModel& model, const at::Tensor& inputs,
                                       const at::Tensor& targets, const EvalOptions& o,
                                       EvalUnits* units) {
  AutocastScope autocast(o.mixed_precision, model.device().type());
  auto enter = [units](const ModelUnit& unit) {
    return units != nullptr ? units->Enter(unit) : absl::OkStatus();
  };
  auto leave = [units](const ModelUnit& unit) {
    if (units != nullptr) units->Leave(unit);
  };
  RETURN_IF_ERROR(enter(ModelUnit::Embedding()));
  at::Tensor hidden = model.Embed(inputs);
  leave(ModelUnit::Embedding());
  for (int64_t i = 0; i < model.num_layers(); ++i) {
    RETURN_IF_ERROR(enter(ModelUnit::Layer(i)));
    hidden = model.Layer(i, hidden);
    leave(ModelUnit::Layer(i));
  }
  RETURN_IF_ERROR(enter(ModelUnit::Head()));
  at::Tensor loss = LanguageModelLoss(model, model.FinalNorm(hidden), targets,
                                      o.loss_chunk_tokens, LossReduction::kSum);
  leave(ModelUnit::Head());
  return loss;
}

}  // namespace

absl::StatusOr<EvalResult> EvaluateModel(LlamaModel& model, const TokenDataset& data,
                                         const EvalOptions& o,
                                         const std::function<bool()>& cancelled,
                                         EvalUnits* units) {
  RETURN_IF_ERROR(ValidateEvalOptions(o, model.config().max_position_embeddings));
  RETURN_IF_ERROR(data.Validate(o.seq_len));
  if (model.base_dtype() != at::kFloat && o.mixed_precision != MixedPrecision::kBf16) {
    return absl::FailedPreconditionError(
        "the model's frozen base is bf16 (a LoRA run's base_dtype), which computes under "
        "bf16 autocast only: evaluate with mixed_precision bf16");
  }
  const auto start = std::chrono::steady_clock::now();
  const int64_t windows = EvalWindows(data, o);
  const c10::Device device = model.device();
  model.set_attention_implementation(o.attn_implementation);

  EvalResult result;
  double loss_sum = 0.0;
  bool stopped = false;
  absl::Status failure;  // reading a window, or a unit's Enter
  RETURN_IF_ERROR(TorchBoundary("evaluation", [&] {
    torch::NoGradGuard no_grad;
    for (int64_t first = 0; first < windows; first += o.batch_size) {
      if (first > 0 && cancelled && cancelled()) {
        stopped = true;
        return;
      }
      const int64_t n = std::min(o.batch_size, windows - first);
      // Window i is tokens[i * seq_len, i * seq_len + seq_len] (seq_len + 1
      // tokens, so consecutive windows share one token, as input and target).
      absl::StatusOr<at::Tensor> window =
          data.Window(first * o.seq_len, n * o.seq_len + 1);
      if (!window.ok()) {
        failure = window.status();
        return;
      }
      at::Tensor rows = window->unfold(0, o.seq_len + 1, o.seq_len)
                            .to(device, torch::kInt64)
                            .contiguous();
      at::Tensor inputs = rows.narrow(1, 0, o.seq_len);
      at::Tensor targets = rows.narrow(1, 1, o.seq_len);
      absl::StatusOr<at::Tensor> loss = ForwardLoss(model, inputs, targets, o, units);
      if (!loss.ok()) {
        failure = loss.status();
        return;
      }
      loss_sum += loss->item<double>();
      result.tokens += n * o.seq_len;
      result.batches += 1;
    }
  }));
  RETURN_IF_ERROR(failure);
  if (units != nullptr)
    result.peak_gathered_parameter_bytes = units->peak_gathered_bytes();
  if (stopped) {
    return absl::CancelledError(absl::StrCat("evaluation cancelled after ",
                                             result.batches, " of ", EvalBatches(data, o),
                                             " batches"));
  }
  result.loss = loss_sum / static_cast<double>(result.tokens);
  result.perplexity = std::exp(result.loss);
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace memprofd

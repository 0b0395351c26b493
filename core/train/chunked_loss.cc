#include "core/train/chunked_loss.h"

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>
#include <string_view>

#include "core/model/llama.h"
#include "core/train/autocast.h"
#include "core/train/eval_options.h"
#include "core/train/meta_autocast.h"

namespace memprofd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

constexpr int64_t kIgnoreIndex = -100;

// The dtype the head's matmuls run in: autocast's when it is on for the
// device and would cast these floating-point tensors (as it casts the
// unchunked linear's), else the weight's.
at::ScalarType HeadComputeType(const at::Tensor& hidden, const at::Tensor& weight) {
  const c10::DeviceType device = hidden.device().type();
  if (device == c10::DeviceType::Meta) {  // a dry run's autocast (meta_autocast.h)
    return AutocastOn(device) && MetaAutocastEligible(hidden) &&
                   MetaAutocastEligible(weight)
               ? kMetaAutocastDtype
               : weight.scalar_type();
  }
  if (AutocastOn(device) && at::autocast::is_autocast_eligible(hidden, device) &&
      at::autocast::is_autocast_eligible(weight, device)) {
    return at::autocast::get_autocast_dtype(device);
  }
  return weight.scalar_type();
}

struct Chunk {
  int64_t start;
  int64_t rows;
};

}  // namespace

// In namespace memprofd rather than an anonymous one, so that its autograd
// node (backward's op name) reads "...memprofd::ChunkedCrossEntropyFunction>".
class ChunkedCrossEntropyFunction
    : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
 public:
  // Function::apply runs this with grad mode off; autocast is left as the
  // caller set it and read here.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            int64_t chunk_tokens, int64_t reduction, int64_t head_module,
                            int64_t loss_module) {
    TORCH_CHECK(chunk_tokens >= 1, "chunk_tokens must be >= 1, got ", chunk_tokens);
    TORCH_CHECK(weight.dim() == 2 && hidden.size(-1) == weight.size(1), "hidden [..., ",
                hidden.size(-1), "] does not match the head weight ", weight.sizes());
    TORCH_CHECK(targets.numel() * hidden.size(-1) == hidden.numel(), "targets ",
                targets.sizes(), " do not match hidden ", hidden.sizes());
    const at::ScalarType compute = HeadComputeType(hidden, weight);
    // The casts below are autocast's; nothing inside may autocast again.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto head = static_cast<ModuleId>(head_module);
    const auto loss = static_cast<ModuleId>(loss_module);
    const at::Tensor h = hidden.reshape({-1, hidden.size(-1)});
    const at::Tensor t = targets.reshape({-1});
    const int64_t n = h.size(0);

    at::Tensor w;
    {
      ModuleScope scope(head);
      w = weight.to(compute);
    }
    ModuleScope scope(loss);
    const at::Tensor valid = t.ne(kIgnoreIndex);
    const at::Tensor index = t.masked_fill(valid.logical_not(), 0).unsqueeze(1);
    at::Tensor lse = at::empty({n}, h.options().dtype(at::kFloat));
    at::Tensor target_logit = at::empty({n}, h.options().dtype(at::kFloat));
    for (int64_t start = 0; start < n; start += chunk_tokens) {
      const int64_t rows = std::min(chunk_tokens, n - start);
      at::Tensor logits;
      {
        ModuleScope head_scope(head);
        logits = h.narrow(0, start, rows).to(compute).mm(w.t());
      }
      logits = logits.to(at::kFloat);
      lse.narrow(0, start, rows).copy_(at::logsumexp(logits, {1}));
      target_logit.narrow(0, start, rows)
          .copy_(logits.gather(1, index.narrow(0, start, rows)).squeeze(1));
    }
    at::Tensor result = (lse - target_logit).masked_fill_(valid.logical_not(), 0).sum();
    if (static_cast<LossReduction>(reduction) == LossReduction::kMean) {
      result = result / valid.sum();
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["chunk_tokens"] = chunk_tokens;
    ctx->saved_data["reduction"] = reduction;
    ctx->saved_data["head_module"] = head_module;
    ctx->saved_data["loss_module"] = loss_module;
    ctx->saved_data["compute"] = static_cast<int64_t>(compute);
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const int64_t chunk_tokens = ctx->saved_data["chunk_tokens"].toInt();
    const auto reduction =
        static_cast<LossReduction>(ctx->saved_data["reduction"].toInt());
    const auto head = static_cast<ModuleId>(ctx->saved_data["head_module"].toInt());
    const auto loss = static_cast<ModuleId>(ctx->saved_data["loss_module"].toInt());
    const auto compute = static_cast<at::ScalarType>(ctx->saved_data["compute"].toInt());
    // Backward runs outside autocast; the forward's casts are replayed
    // explicitly, and nothing here may autocast.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const at::Tensor h = hidden.reshape({-1, hidden.size(-1)});
    const at::Tensor t = saved[2].reshape({-1});
    const at::Tensor& lse = saved[3];
    const int64_t n = h.size(0);
    const bool want_hidden = ctx->needs_input_grad(0);
    const bool want_weight = ctx->needs_input_grad(1);

    at::Tensor w, grad_hidden, grad_weight;
    {
      ModuleScope scope(head);
      w = weight.to(compute);
      if (want_hidden) grad_hidden = at::empty_like(h);
      if (want_weight)
        grad_weight = at::zeros_like(weight, weight.options().dtype(at::kFloat));
    }
    ModuleScope scope(loss);
    const at::Tensor valid = t.ne(kIgnoreIndex);
    const at::Tensor index = t.masked_fill(valid.logical_not(), 0).unsqueeze(1);
    // d loss / d logit = (softmax - onehot) * scale for kept rows, 0 else.
    at::Tensor scale = grad_outputs[0].to(at::kFloat);
    if (reduction == LossReduction::kMean) scale = scale / valid.sum();
    const at::Tensor row_scale = valid.to(at::kFloat).mul_(scale).unsqueeze(1);
    const at::Tensor minus_one = at::full({1, 1}, -1.0, lse.options());
    for (int64_t start = 0; start < n; start += chunk_tokens) {
      const int64_t rows = std::min(chunk_tokens, n - start);
      at::Tensor hc, logits;
      {
        ModuleScope head_scope(head);
        hc = h.narrow(0, start, rows).to(compute);
        logits = hc.mm(w.t());
      }
      at::Tensor grad = logits.to(at::kFloat);
      logits.reset();
      grad.sub_(lse.narrow(0, start, rows).unsqueeze(1)).exp_();
      grad.scatter_add_(1, index.narrow(0, start, rows), minus_one.expand({rows, 1}));
      grad.mul_(row_scale.narrow(0, start, rows));
      ModuleScope head_scope(head);
      if (compute == at::kFloat) {
        if (want_hidden) grad_hidden.narrow(0, start, rows).copy_(grad.mm(w));
        if (want_weight) grad_weight.addmm_(grad.t(), hc);
        continue;
      }
      // Autocast's backward: the logits' gradient cast to the compute dtype,
      // both matmuls on the cast values. The weight's is summed over the
      // chunks in float32 from the rounded values (as one bf16 matmul sums
      // internally) and rounded once at the end, as the unchunked matmul
      // rounds its output.
      const at::Tensor low = grad.to(compute);
      if (want_hidden) grad_hidden.narrow(0, start, rows).copy_(low.mm(w));
      if (want_weight) grad_weight.addmm_(grad.copy_(low).t(), hc.to(at::kFloat));
    }
    if (want_weight && compute != at::kFloat) {
      grad_weight = grad_weight.to(compute).to(weight.scalar_type());
    }
    if (want_hidden) grad_hidden = grad_hidden.view(hidden.sizes());
    // No gradient for the targets and the four integers.
    return {grad_hidden,  grad_weight,  at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

int64_t AutomaticLossChunkTokens(int64_t vocab_size, int64_t hidden_size) {
  const int64_t by_bytes = kMaxLossChunkBytes / (static_cast<int64_t>(sizeof(float)) *
                                                 std::max<int64_t>(vocab_size, 1));
  return std::max(kMinLossChunkTokens, std::min(hidden_size, by_bytes));
}

int64_t ResolveLossChunkTokens(int64_t loss_chunk_tokens, int64_t vocab_size,
                               int64_t hidden_size) {
  if (loss_chunk_tokens == kLossChunkOff) return 0;
  if (loss_chunk_tokens == kLossChunkAutomatic) {
    return AutomaticLossChunkTokens(vocab_size, hidden_size);
  }
  return loss_chunk_tokens;
}

at::Tensor ChunkedHeadCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight,
                                   const at::Tensor& targets, int64_t chunk_tokens,
                                   LossReduction reduction, ModuleId head_module,
                                   ModuleId loss_module) {
  // The op that names the chunks' allocations in forward (the op callbacks
  // keep the outermost op of a nest).
  at::RecordFunction op(at::RecordScope::FUNCTION);
  if (op.isActive()) op.before(std::string_view("memprofd::chunked_cross_entropy"));
  return ChunkedCrossEntropyFunction::apply(
      hidden, weight, targets, chunk_tokens, static_cast<int64_t>(reduction),
      static_cast<int64_t>(head_module), static_cast<int64_t>(loss_module));
}

at::Tensor LanguageModelLoss(const LlamaModel& model, const at::Tensor& hidden,
                             const at::Tensor& targets, int64_t loss_chunk_tokens,
                             LossReduction reduction) {
  static const ModuleId loss_module = InternModule("loss");
  const int64_t vocab = model.config().vocab_size;
  const int64_t chunk =
      ResolveLossChunkTokens(loss_chunk_tokens, vocab, model.config().hidden_size);
  if (chunk > 0) {
    at::Tensor weight;
    {
      ModuleScope scope(model.head_module());
      weight = model.HeadWeight();
    }
    return ChunkedHeadCrossEntropy(hidden, weight, targets, chunk, reduction,
                                   model.head_module(), loss_module);
  }
  at::Tensor logits = model.Head(hidden);
  ModuleScope loss_scope(loss_module);
  // A float32 loss, as transformers' ForCausalLMLoss upcasts the logits (a
  // no-op without mixed precision).
  torch::nn::functional::CrossEntropyFuncOptions options;
  if (reduction == LossReduction::kSum) options.reduction(torch::kSum);
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32).view({-1, vocab}), targets.reshape({-1}), options);
}

}  // namespace memprofd

#include "core/train/chunked_loss.h"

#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>
#include <string_view>

#include "core/memory/tagging.h"
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

// The float32 rows of a [vocab, hidden] gradient widened from bf16 at a
// time on the CPU: LibTorch's CPU add_ of a bf16 tensor into a float32 one
// widens the whole bf16 operand into a hidden temporary first (the weight's
// size in float32, which a dry run cannot see); explicit casts of blocks of
// at most this many bytes bound it and show it to the planner. CUDA's add_
// casts inside its kernel: one call there (blocks would be launches).
constexpr int64_t kWidenBlockBytes = int64_t{4} << 20;

void AddWidened(at::Tensor& sum, const at::Tensor& part) {
  const c10::DeviceType device = sum.device().type();
  if (device != c10::DeviceType::CPU &&
      !(device == c10::DeviceType::Meta &&
        CurrentMetaAutocastTarget() == MetaAutocastTarget::kCpu)) {
    sum.add_(part);
    return;
  }
  const int64_t rows = std::max<int64_t>(
      1, kWidenBlockBytes / std::max<int64_t>(sum.size(1) * sum.element_size(), 1));
  for (int64_t start = 0; start < sum.size(0); start += rows) {
    const int64_t n = std::min(rows, sum.size(0) - start);
    sum.narrow(0, start, n).add_(part.narrow(0, start, n).to(sum.scalar_type()));
  }
}

// What the forward pass leaves: the float32 scalar loss, and, when asked
// for, its gradients: `grad_hidden` [tokens, hidden] in the compute dtype
// (ignored rows zero) and `grad_weight` [vocab, hidden] in float32. Backward
// multiplies both by the incoming gradient.
struct FusedForward {
  at::Tensor loss;
  at::Tensor grad_hidden;
  at::Tensor grad_weight;
};

// The head's logits, the loss and (want_hidden, want_weight) its gradients,
// chunk by chunk. Every chunk reuses the same [chunk x vocab] buffers: a
// fresh buffer per chunk costs the CPU allocator's page faults on every one
// (as much as the log-softmax itself at 128k ids).
FusedForward RunFused(const at::Tensor& hidden, const at::Tensor& weight,
                      const at::Tensor& targets, int64_t chunk_tokens,
                      LossReduction reduction, bool want_hidden, bool want_weight,
                      ModuleId head, ModuleId loss) {
  TORCH_CHECK(chunk_tokens >= 1, "chunk_tokens must be >= 1, got ", chunk_tokens);
  TORCH_CHECK(weight.dim() == 2 && hidden.size(-1) == weight.size(1), "hidden [..., ",
              hidden.size(-1), "] does not match the head weight ", weight.sizes());
  TORCH_CHECK(targets.numel() * hidden.size(-1) == hidden.numel(), "targets ",
              targets.sizes(), " do not match hidden ", hidden.sizes());
  const at::ScalarType compute = HeadComputeType(hidden, weight);
  const bool low = compute != at::kFloat;
  // The casts below are autocast's; nothing inside may autocast again.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor h = hidden.reshape({-1, hidden.size(-1)});
  const at::Tensor t = targets.reshape({-1});
  const int64_t n = h.size(0);
  const int64_t vocab = weight.size(0);
  const int64_t rows_max = std::max<int64_t>(std::min(chunk_tokens, n), 1);
  const bool grads = want_hidden || want_weight;
  const at::TensorOptions f32 = h.options().dtype(at::kFloat);

  FusedForward out;
  at::Tensor w, low_logits, low_part;
  {
    ModuleScope scope(head);
    w = weight.to(compute);
    // The chunk's logits in the compute dtype, then its gradient cast back
    // to it for the two matmuls; and one chunk's share of the weight's
    // gradient, summed into float32.
    if (low) low_logits = at::empty({rows_max, vocab}, h.options().dtype(compute));
    if (low && want_weight) low_part = at::empty_like(weight, w.options());
    if (want_hidden)
      out.grad_hidden = at::empty({n, h.size(1)}, h.options().dtype(compute));
  }
  if (want_weight) {
    // The weight's gradient, made early: counted as its parameter's gradient
    // (it becomes .grad in backward, adopted without a copy).
    memory::OwnedByScope owner(weight, Category::kGradients);
    out.grad_weight = at::empty(weight.sizes(), f32);
  }
  // The float32 logits: the head's output, or under autocast the loss's
  // upcast of it (as in the unchunked path).
  at::Tensor logits_buffer;
  {
    ModuleScope scope(low ? loss : head);
    logits_buffer = at::empty({rows_max, vocab}, f32);
  }
  ModuleScope scope(loss);
  const at::Tensor valid = t.ne(kIgnoreIndex);
  const at::Tensor index = t.masked_fill(valid.logical_not(), 0).unsqueeze(1);
  // d loss / d logits = (softmax - onehot(target)) * row_scale: 1 / kept
  // tokens for the mean (1 for the sum), 0 for an ignored target.
  at::Tensor row_scale = valid.to(at::kFloat).unsqueeze(1);
  if (reduction == LossReduction::kMean) row_scale.div_(valid.sum());
  at::Tensor target_logprob = at::empty({n}, f32);
  for (int64_t start = 0; start < n; start += chunk_tokens) {
    const int64_t rows = std::min(chunk_tokens, n - start);
    at::Tensor logits = logits_buffer.narrow(0, 0, rows);
    at::Tensor hc, lowc;
    {
      ModuleScope head_scope(head);
      hc = h.narrow(0, start, rows).to(compute);
      if (low) {
        lowc = low_logits.narrow(0, 0, rows);
        at::mm_out(lowc, hc, w.t());
      } else {
        at::mm_out(logits, hc, w.t());
      }
    }
    if (low) logits.copy_(lowc);  // the loss in float32, as transformers upcasts
    at::_log_softmax_out(logits, logits, 1, false);
    const at::Tensor idx = index.narrow(0, start, rows);
    const at::Tensor logprob = logits.gather(1, idx);
    target_logprob.narrow(0, start, rows).copy_(logprob.squeeze(1));
    if (!grads) continue;
    // The logits' gradient, (softmax - onehot(target)) * scale, in place and
    // in float32, rounded once to the compute dtype after. In the order
    // log_softmax's backward computes it under cross_entropy, so that a
    // whole batch in one chunk gets the unchunked gradient bit for bit:
    // exp(logp) * scale everywhere, then the target's minus scale. Scaling
    // after the matmuls would save a pass but moves the float32 gradients by
    // up to 1e-6 of the unchunked ones; a mul_out into the bf16 buffer would
    // save one, but LibTorch's CPU kernels compute a mixed-dtype output in a
    // hidden float32 temporary, which a dry run cannot see.
    const at::Tensor scale = row_scale.narrow(0, start, rows);
    at::exp_out(logits, logits);
    logits.mul_(scale);
    logits.scatter_add_(1, idx, scale.neg());
    if (low) lowc.copy_(logits);
    const at::Tensor dlogits = low ? lowc : logits;
    ModuleScope head_scope(head);
    if (want_hidden) {
      at::Tensor dh = out.grad_hidden.narrow(0, start, rows);
      at::mm_out(dh, dlogits, w);
    }
    if (want_weight) {
      if (low) {
        at::mm_out(low_part, dlogits.t(), hc);
        if (start == 0) {
          out.grad_weight.copy_(low_part);
        } else {
          AddWidened(out.grad_weight, low_part);
        }
      } else if (start == 0) {
        at::mm_out(out.grad_weight, dlogits.t(), hc);
      } else {
        out.grad_weight.addmm_(dlogits.t(), hc);
      }
    }
  }
  at::Tensor sum = target_logprob.masked_fill_(valid.logical_not(), 0).sum().neg_();
  out.loss = reduction == LossReduction::kMean ? sum.div_(valid.sum()) : sum;
  return out;
}

}  // namespace

// In namespace memprofd rather than an anonymous one, so that its autograd
// node (backward's op name) reads "...memprofd::FusedLinearCrossEntropy>".
class FusedLinearCrossEntropy
    : public torch::autograd::Function<FusedLinearCrossEntropy> {
 public:
  // Function::apply runs this with grad mode off; autocast is left as the
  // caller set it and read here. Called only when some input needs a
  // gradient (ChunkedHeadCrossEntropy runs RunFused directly otherwise).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            int64_t chunk_tokens, int64_t reduction, int64_t head_module,
                            int64_t loss_module) {
    FusedForward f = RunFused(
        hidden, weight, targets, chunk_tokens, static_cast<LossReduction>(reduction),
        hidden.requires_grad(), weight.requires_grad(),
        static_cast<ModuleId>(head_module), static_cast<ModuleId>(loss_module));
    // The hidden states' gradient is what backward needs of the forward, as
    // a saved activation (the offloader's hooks see it, like any other); the
    // weight's is a gradient already, held beside the graph.
    ctx->save_for_backward({f.grad_hidden});
    ctx->saved_data["grad_weight"] = f.grad_weight;
    ctx->saved_data["pending"] = true;
    ctx->saved_data["hidden_sizes"] = hidden.sizes();
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["head_module"] = head_module;
    return f.loss;
  }

  // Only scales what forward computed: no matmul, no [tokens x vocab].
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK(ctx->saved_data.count("pending") > 0,
                "the fused linear cross-entropy's backward runs once: its gradients were "
                "computed in forward and handed out (retain_graph is not supported)");
    at::Tensor grad_hidden = ctx->get_saved_variables()[0];
    at::Tensor grad_weight = ctx->saved_data["grad_weight"].toTensor();
    const at::Tensor scale = grad_outputs[0].to(at::kFloat);
    const auto hidden_dtype =
        static_cast<at::ScalarType>(ctx->saved_data["hidden_dtype"].toInt());
    const auto weight_dtype =
        static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const std::vector<int64_t> hidden_sizes =
        ctx->saved_data["hidden_sizes"].toIntVector();
    ModuleScope scope(static_cast<ModuleId>(ctx->saved_data["head_module"].toInt()));
    // Dropped from the node, so that the weight's gradient is handed out with
    // no other owner (AccumulateGrad adopts it rather than copying).
    ctx->saved_data.erase("grad_weight");
    ctx->saved_data.erase("pending");
    if (grad_hidden.defined()) {
      grad_hidden = grad_hidden.scalar_type() == hidden_dtype
                        ? grad_hidden.mul_(scale)
                        : grad_hidden.to(hidden_dtype).mul_(scale);
      grad_hidden = grad_hidden.view(hidden_sizes);
    }
    if (grad_weight.defined()) {
      grad_weight.mul_(scale);
      if (weight_dtype != at::kFloat) grad_weight = grad_weight.to(weight_dtype);
    }
    // No gradient for the targets and the four integers.
    return {grad_hidden,  std::move(grad_weight), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(),           at::Tensor()};
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
  if (op.isActive()) op.before(std::string_view("memprofd::fused_linear_cross_entropy"));
  if (!at::GradMode::is_enabled() ||
      !(hidden.requires_grad() || weight.requires_grad())) {
    // Evaluation: the loss alone, no gradient computed and no node.
    return RunFused(hidden, weight, targets, chunk_tokens, reduction, false, false,
                    head_module, loss_module)
        .loss;
  }
  return FusedLinearCrossEntropy::apply(
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

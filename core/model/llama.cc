// LlamaModel: construction and the forward math (RMSNorm, rotary attention
// with grouped-query heads, the SwiGLU MLP, the head), as Hugging Face's
// modeling_llama computes it. Where the weights live and how they are named,
// initialised and loaded is in llama_weights.cc.

#include "core/model/llama.h"

#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <string>

#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"

namespace memprofd {
namespace {

// HF's rotate_half: (x1, x2) -> (-x2, x1) over the last dimension's halves.
at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// residual + branch, in place into `branch` (a projection's output, which
// backward does not need) when their dtypes agree.
at::Tensor Residual(const at::Tensor& residual, at::Tensor branch) {
  if (branch.scalar_type() == residual.scalar_type()) return branch.add_(residual);
  return residual + branch;
}

std::vector<LayerParameter> LayerParametersOf(const LlamaConfig& config) {
  std::vector<LayerParameter> out;
  for (const LayerParameter& param : kLayerParameters) {
    if (HasLayerPart(config, param.part)) out.push_back(param);
  }
  return out;
}

// What a sliding window of `window` keys lets each of `t` queries attend
// to: key k for query q when q - window < k <= q. [t, t] bool, true to
// attend (SDPA's convention for a boolean mask).
at::Tensor SlidingWindowMask(int64_t t, int64_t window, c10::Device device) {
  at::Tensor q =
      torch::arange(t, torch::TensorOptions().dtype(torch::kInt64).device(device))
          .unsqueeze(1);
  at::Tensor k = q.transpose(0, 1);
  return k.le(q).logical_and_(k.gt(q - window));
}

}  // namespace

bool HasLayerPart(const LlamaConfig& config, LayerPart part) {
  switch (part) {
    case LayerPart::kAlways:
      return true;
    case LayerPart::kQkvBias:
      return config.qkv_bias();
    case LayerPart::kOBias:
      return config.o_bias();
    case LayerPart::kQkNorm:
      return config.qk_norm();
    case LayerPart::kMlpBias:
      return config.mlp_bias;
  }
  return false;
}

LlamaModel::LlamaModel(LlamaConfig config, c10::Device device)
    : config_(std::move(config)),
      device_(device),
      layer_parameters_(LayerParametersOf(config_)) {
  embed_module_ = InternModule("model.embed_tokens");
  norm_module_ = InternModule("model.norm");
  head_module_ = InternModule("lm_head");
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i);
    auto sub = [&](const char* name) { return InternModule(layer + "." + name); };
    layer_modules_.push_back(
        {InternModule(layer), sub("input_layernorm"), sub("self_attn"),
         sub("self_attn.q_proj"), sub("self_attn.k_proj"), sub("self_attn.v_proj"),
         sub("self_attn.o_proj"), sub("self_attn.q_norm"), sub("self_attn.k_norm"),
         sub("post_attention_layernorm"), sub("mlp"), sub("mlp.gate_proj"),
         sub("mlp.up_proj"), sub("mlp.down_proj")});
  }
}

LlamaModel::~LlamaModel() = default;

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    const LlamaConfig& config, uint64_t seed, c10::Device device,
    at::ScalarType base_dtype) {
  RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, device));
  // A model without weights yet: only the dtype itself can be refused.
  RETURN_IF_ERROR(model->CheckBaseDtype(base_dtype));
  model->base_dtype_ = base_dtype;
  RETURN_IF_ERROR(TorchBoundary("creating the model", [&] { model->Initialize(seed); }));
  return model;
}

at::Tensor LlamaModel::RmsNorm(const at::Tensor& x, const at::Tensor& weight) const {
  at::Tensor xf = x.to(torch::kFloat32);
  at::Tensor variance = xf.pow(2).mean(-1, /*keepdim=*/true);
  // A bf16 base's weight times a bf16 input (Qwen3's per-head norms under
  // autocast) multiplies in float32, as the float32 weight it was rounded
  // from does; with a float32 operand, type promotion does that alone.
  const at::Tensor w = weight.scalar_type() == at::kFloat || x.scalar_type() == at::kFloat
                           ? weight
                           : weight.to(at::kFloat);
  return w * (xf * torch::rsqrt(variance + config_.rms_norm_eps)).to(x.scalar_type());
}

at::Tensor LlamaModel::MetaSdpa(const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v,
                                const std::optional<at::Tensor>& mask,
                                bool windowed) const {
  const bool gqa = k.size(1) != q.size(1);
  MetaSdpaKernel kernel = meta_sdpa_kernel_;
  if (windowed && kernel != MetaSdpaKernel::kCpuFlash) kernel = MetaSdpaKernel::kMath;
  switch (kernel) {
    case MetaSdpaKernel::kCpuFlash:
      return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(
          q, k, v, /*dropout_p=*/0.0, /*is_causal=*/!windowed, mask));
    case MetaSdpaKernel::kCudaFlash:
      // Flash attention takes grouped key/value heads as they are.
      return std::get<0>(at::_scaled_dot_product_flash_attention(
          q, k, v, /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false));
    case MetaSdpaKernel::kCudaEfficient: {
      // The log-sum-exp is kept only when backward will need it, as SDPA
      // decides; grouped heads are repeated first, as SDPA repeats them for
      // the kernels that do not take them.
      const bool lse = at::GradMode::is_enabled() &&
                       (q.requires_grad() || k.requires_grad() || v.requires_grad());
      const int64_t n_rep = q.size(1) / k.size(1);
      return std::get<0>(at::_scaled_dot_product_efficient_attention(
          q, gqa ? k.repeat_interleave(n_rep, 1) : k,
          gqa ? v.repeat_interleave(n_rep, 1) : v, /*attn_bias=*/std::nullopt, lse,
          /*dropout_p=*/0.0, /*is_causal=*/true));
    }
    case MetaSdpaKernel::kMath:
      break;
  }
  return at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0,
                                          /*is_causal=*/!windowed,
                                          /*scale=*/std::nullopt, /*enable_gqa=*/gqa);
}

at::Tensor LlamaModel::Project(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, const LoraPair& lora) const {
  at::Tensor out = torch::linear(x, weight, bias);
  if (!lora.a.defined()) return out;
  // peft's Linear.forward: result + lora_B(lora_A(dropout(x))) * scaling,
  // added in place (the same rounding: scaling * B(A(x)), then the sum)
  // rather than through two [tokens, out] temporaries. linear's backward
  // needs its inputs, not its output, so the output may change.
  const at::Tensor in =
      lora_dropout_key_ && lora_->dropout > 0
          ? LoraDropout(x, lora_->dropout, MixSeed(*lora_dropout_key_, lora.key))
          : x;
  return out.add_(torch::linear(torch::linear(in, lora.a), lora.b), lora_->Scaling());
}

at::Tensor LlamaModel::Attention(const LlamaLayerWeights& w, const LlamaLayerLora& lora,
                                 const LayerModules& m, int64_t window,
                                 const at::Tensor& h) const {
  ModuleScope module(m.self_attn);
  const int64_t b = h.size(0);
  const int64_t t = h.size(1);
  const int64_t heads = config_.num_attention_heads;
  const int64_t kv_heads = config_.num_key_value_heads;
  const int64_t d = config_.head_dim();
  TORCH_CHECK(t <= config_.max_position_embeddings, "sequence length ", t,
              " exceeds max_position_embeddings ", config_.max_position_embeddings);

  // [B, T, n, D]; Qwen3 normalises each head of q and k here (RMSNorm over
  // head_dim), before the rotary embedding, as transformers does.
  auto project = [&](ModuleId id, const at::Tensor& weight, const at::Tensor& bias,
                     const LoraPair& adapter, int64_t n) {
    ModuleScope proj(id);
    return Project(h, weight, bias, adapter).view({b, t, n, d});
  };
  auto head_norm = [&](ModuleId id, const at::Tensor& x, const at::Tensor& weight) {
    if (!weight.defined()) return x;
    ModuleScope norm(id);
    return RmsNorm(x, weight);
  };
  at::Tensor q =
      head_norm(m.q_norm, project(m.q_proj, w.q_proj, w.q_bias, lora.q_proj, heads),
                w.q_norm)
          .transpose(1, 2);
  at::Tensor k =
      head_norm(m.k_norm, project(m.k_proj, w.k_proj, w.k_bias, lora.k_proj, kv_heads),
                w.k_norm)
          .transpose(1, 2);
  at::Tensor v =
      project(m.v_proj, w.v_proj, w.v_bias, lora.v_proj, kv_heads).transpose(1, 2);

  at::Tensor cos = rope_cos_.narrow(0, 0, t);
  at::Tensor sin = rope_sin_.narrow(0, 0, t);
  q = q * cos + RotateHalf(q) * sin;
  k = k * cos + RotateHalf(k) * sin;

  // A window at least as long as the sequence changes nothing: plain causal.
  const bool windowed = window > 0 && window < t;
  if (attention_ == AttentionImplementation::kSdpa) {
    // Causal, key/value heads as they are (enable_gqa: key/value head k
    // serves query heads [k * n_rep, (k + 1) * n_rep), as repeat_kv does).
    // A sliding window needs an explicit mask (causal within the window),
    // which SDPA's causal flag cannot express.
    std::optional<at::Tensor> mask;
    if (windowed) mask = SlidingWindowMask(t, window, h.device());
    at::Tensor out = q.is_meta() ? MetaSdpa(q, k, v, mask, windowed)
                                 : at::scaled_dot_product_attention(
                                       q, k, v, mask, /*dropout_p=*/0.0,
                                       /*is_causal=*/!windowed, /*scale=*/std::nullopt,
                                       /*enable_gqa=*/kv_heads != heads);
    at::Tensor merged = out.transpose(1, 2).reshape({b, t, heads * d});
    ModuleScope proj(m.o_proj);
    return Project(merged, w.o_proj, w.o_bias, lora.o_proj);
  }
  if (kv_heads != heads) {
    // HF's repeat_kv: [B, KV, T, D] -> [B, KV * n_rep, T, D], grouped by kv head.
    const int64_t n_rep = heads / kv_heads;
    k = k.unsqueeze(2).expand({b, kv_heads, n_rep, t, d}).reshape({b, heads, t, d});
    v = v.unsqueeze(2).expand({b, kv_heads, n_rep, t, d}).reshape({b, heads, t, d});
  }

  at::Tensor scores = torch::matmul(q, k.transpose(2, 3)) * (1.0 / std::sqrt(double(d)));
  at::Tensor future =
      windowed
          ? SlidingWindowMask(t, window, h.device()).logical_not_()
          : torch::ones({t, t},
                        torch::TensorOptions().dtype(torch::kBool).device(h.device()))
                .triu(1);
  // In place: nothing saved for backward refers to the scaled scores (the
  // scalar multiply saves no tensor), so this saves a [B, H, T, T] copy.
  scores.masked_fill_(future, -std::numeric_limits<float>::infinity());
  at::Tensor probs = torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type());
  at::Tensor out = torch::matmul(probs, v).transpose(1, 2).reshape({b, t, heads * d});
  ModuleScope proj(m.o_proj);
  return Project(out, w.o_proj, w.o_bias, lora.o_proj);
}

at::Tensor LlamaModel::Layer(int64_t index, const at::Tensor& hidden) const {
  const LlamaLayerWeights& home = layers_.at(index);
  const LayerModules& m = layer_modules_.at(static_cast<size_t>(index));
  ModuleScope layer(m.layer);
  LlamaLayerWeights w;
  for (const LayerParameter& param : layer_parameters_) {
    w.*param.member = Fetch(home.*param.member);
  }
  at::Tensor normed;
  {
    ModuleScope norm(m.input_layernorm);
    normed = RmsNorm(hidden, w.input_layernorm);
  }
  // Residual adds in place into the projection outputs, which linear's
  // backward does not save; a + b == b + a exactly, so the result is that of
  // hidden + attention. Under bf16 autocast the projections are bf16 and the
  // residual stream float32: the sum is float32 (type promotion), as in
  // transformers, so it cannot go in place.
  static const LlamaLayerLora kNoLora;
  const LlamaLayerLora& lora =
      lora_layers_.empty() ? kNoLora : lora_layers_[static_cast<size_t>(index)];
  at::Tensor x =
      Residual(hidden, Attention(w, lora, m, config_.LayerWindow(index), normed));
  at::Tensor h;
  {
    ModuleScope norm(m.post_attention_layernorm);
    h = RmsNorm(x, w.post_attention_layernorm);
  }
  ModuleScope mlp_scope(m.mlp);
  at::Tensor gate, up;
  {
    ModuleScope proj(m.gate_proj);
    gate = Project(h, w.gate_proj, w.gate_bias, lora.gate_proj);
  }
  {
    ModuleScope proj(m.up_proj);
    up = Project(h, w.up_proj, w.up_bias, lora.up_proj);
  }
  at::Tensor act = torch::silu(gate) * up;
  ModuleScope proj(m.down_proj);
  at::Tensor mlp = Project(act, w.down_proj, w.down_bias, lora.down_proj);
  return Residual(x, mlp);
}

at::Tensor LlamaModel::Embed(const at::Tensor& input_ids) const {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [batch, seq_len], got ",
              input_ids.sizes());
  ModuleScope module(embed_module_);
  // The residual stream is float32 whatever the base's dtype: a bf16 base's
  // rows widen exactly to the float32 rows they were rounded from.
  at::Tensor h = torch::embedding(Fetch(embed_tokens_), input_ids);
  return h.scalar_type() == at::kFloat ? h : h.to(at::kFloat);
}

at::Tensor LlamaModel::FinalNorm(const at::Tensor& hidden) const {
  ModuleScope module(norm_module_);
  return RmsNorm(hidden, Fetch(norm_));
}

at::Tensor LlamaModel::Head(const at::Tensor& hidden) const {
  ModuleScope module(head_module_);
  return torch::linear(hidden, Fetch(lm_head_));
}

at::Tensor LlamaModel::HeadWeight() const { return Fetch(lm_head_); }

at::Tensor LlamaModel::ForwardHidden(const at::Tensor& input_ids) const {
  at::Tensor x = Embed(input_ids);
  for (int64_t i = 0; i < num_layers(); ++i) x = Layer(i, x);
  return FinalNorm(x);
}

at::Tensor LlamaModel::Forward(const at::Tensor& input_ids) const {
  return Head(ForwardHidden(input_ids));
}

}  // namespace memprofd

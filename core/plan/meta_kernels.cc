// Meta kernels for the ops a Llama training step reaches on the meta device
// and that LibTorch 2.11 has a Meta kernel for only in Python
// (torch/_meta_registrations.py, which a C++ process never loads;
// `torch._C._dispatch_dump(op)` shows "Meta: registered at
// .../_meta_registrations.py" and no C++ Meta or CompositeExplicitAutograd
// kernel). Found by running memprofd's training step on meta
// (tests/plan/planner_test.cc) until nothing threw "no fake impl or Meta
// kernel registered", and cross-checked in Python with _meta_registrations'
// library destroyed (a transformers Llama step on meta then fails on exactly
// the ops below but the CPU flash attention, which meta dispatch never picks):
// - aten::index_select: torch::embedding's lookup;
// - aten::embedding_dense_backward: the embedding's gradient;
// - aten::where.self_out and aten::where.self: SDPA on meta takes the math
//   path (the Meta kernel of _fused_sdp_choice picks it, so the CPU flash
//   kernels are never reached), whose _safe_softmax writes with where.out
//   and whose backward calls where;
// - aten::_fused_adamw_: FusedAdamW's step, in place;
// - aten::logical_not.out: the chunked loss's mask of ignored targets;
// - aten::abs.out: Tensor::norm() (the gradient norm) through norm.Scalar;
// - aten::logical_and.out: a sliding window's attention mask, built in place
//   (SlidingWindowMask in core/model/llama.cc);
// - aten::_scaled_dot_product_flash_attention_for_cpu and its backward: the
//   CPU's SDPA kernel, which a dry run planning a CPU step asks for
//   explicitly (LlamaModel::set_meta_sdpa_kernel);
// - aten::_scaled_dot_product_flash_attention, _efficient_attention and
//   their backwards: CUDA's SDPA kernels, which a dry run planning a CUDA
//   step asks for the same way (their shapes are those the CUDA kernels
//   allocate; what they allocate inside themselves and free, such as flash
//   backward's float32 accumulator, is not seen).
// Each kernel only checks its arguments and allocates its outputs with the
// CPU kernel's shapes and dtypes; none reads data (meta tensors have none).

#include "core/plan/meta_kernels.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <array>
#include <string>

#include "absl/strings/str_cat.h"

namespace memprofd::plan {
namespace {

at::Tensor IndexSelectMeta(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32 or int64 for index");
  if (self.dim() == 0) return at::empty({}, self.options());
  dim = at::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> sizes = self.sizes().vec();
  sizes[dim] = index.numel();
  return at::empty(sizes, self.options());
}

at::Tensor EmbeddingDenseBackwardMeta(const at::Tensor& grad_output,
                                      const at::Tensor& indices, c10::SymInt num_weights,
                                      c10::SymInt /*padding_idx*/,
                                      bool /*scale_grad_by_freq*/) {
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt,
              "embedding_dense_backward(): Expected dtype int32 or int64 for indices");
  return at::empty_symint({std::move(num_weights), grad_output.sym_size(-1)},
                          grad_output.options());
}

at::Tensor WhereSelfMeta(const at::Tensor& condition, const at::Tensor& self,
                         const at::Tensor& other) {
  TORCH_CHECK(
      condition.scalar_type() == at::kBool,
      "where expected condition to be a boolean tensor, but got a tensor with dtype ",
      condition.scalar_type());
  const at::ScalarType dtype = at::result_type(self, other);
  const std::vector<int64_t> sizes =
      at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  return at::empty(sizes, self.options().dtype(dtype));
}

at::Tensor& WhereSelfOutMeta(const at::Tensor& condition, const at::Tensor& self,
                             const at::Tensor& other, at::Tensor& out) {
  const at::Tensor shape = WhereSelfMeta(condition, self, other);
  TORCH_CHECK(out.scalar_type() == shape.scalar_type(), "where: expected out dtype ",
              shape.scalar_type(), ", got ", out.scalar_type());
  at::native::resize_output(out, shape.sizes());
  return out;
}

// Elementwise ops into `out`: out takes self's shape (its dtype is the
// caller's, as the CPU kernels check it).
at::Tensor& UnaryOutMeta(const at::Tensor& self, at::Tensor& out) {
  at::native::resize_output(out, self.sizes());
  return out;
}

// Elementwise binary ops into `out` (logical_and, which a sliding window's
// mask calls in place): out takes the broadcast shape of the operands.
at::Tensor& BinaryOutMeta(const at::Tensor& self, const at::Tensor& other,
                          at::Tensor& out) {
  at::native::resize_output(out, at::infer_size(self.sizes(), other.sizes()));
  return out;
}

// A tensor shaped as `x` ([B, H, T, D]) laid out in [B, T, H, D] memory, as
// the attention kernels allocate their outputs and gradients.
at::Tensor EmptyHeadsInner(const at::Tensor& x) {
  return at::empty(x.transpose(1, 2).sizes(), x.options()).transpose(1, 2);
}

// The CPU's flash attention (what SDPA runs on the CPU for every shape memprofd
// trains; a dry run planning a CPU step calls it, LlamaModel::
// set_meta_sdpa_kernel): the output in [B, T, H, D] memory seen as
// [B, H, T, D], the log-sum-exp [B, T, H] in the accumulation type seen as
// [B, H, T], and in backward zeroed gradients of the inputs' transposed
// shapes, transposed back. Key and value may have fewer heads (GQA).
std::tuple<at::Tensor, at::Tensor> FlashAttentionForCpuMeta(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    double /*dropout_p*/, bool /*is_causal*/,
    const std::optional<at::Tensor>& /*attn_mask*/, std::optional<double> /*scale*/) {
  TORCH_CHECK(
      query.dim() == 4 && key.dim() == 4 && value.dim() == 4,
      "_scaled_dot_product_flash_attention_for_cpu: expected 4-D query, key, value");
  const int64_t b = query.size(0), h = query.size(1), t = query.size(2);
  const at::ScalarType accumulate =
      at::isReducedFloatingType(query.scalar_type()) ? at::kFloat : query.scalar_type();
  at::Tensor output = EmptyHeadsInner(query);
  at::Tensor logsumexp =
      at::empty({b, t, h}, query.options().dtype(accumulate)).transpose(1, 2);
  return {std::move(output), std::move(logsumexp)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> FlashAttentionForCpuBackwardMeta(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& /*out*/, const at::Tensor& /*logsumexp*/,
    double /*dropout_p*/, bool /*is_causal*/,
    const std::optional<at::Tensor>& /*attn_mask*/, std::optional<double> /*scale*/) {
  if (!grad_out.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
  return {EmptyHeadsInner(query), EmptyHeadsInner(key), EmptyHeadsInner(value)};
}

// CUDA's flash attention (what SDPA runs there for bf16 without a mask; a
// dry run planning a CUDA step asks for it when the target would pick it):
// the output in [B, T, H, D] memory seen as [B, H, T, D], the float32
// log-sum-exp [B, H, T], no cumulative sequence lengths (dense inputs), the
// sequence lengths, the RNG state (a seed pair and an offset, uint64) and an
// empty debug mask. Key and value may have fewer heads (the kernel takes
// grouped heads as they are). Backward: gradients shaped as the inputs.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt,
           at::Tensor, at::Tensor, at::Tensor>
CudaFlashAttentionMeta(const at::Tensor& query, const at::Tensor& key,
                       const at::Tensor& value, double /*dropout_p*/, bool /*is_causal*/,
                       bool /*return_debug_mask*/, std::optional<double> /*scale*/) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4,
              "_scaled_dot_product_flash_attention: expected 4-D query, key, value");
  const int64_t b = query.size(0), h = query.size(1), t = query.size(2);
  at::Tensor output = EmptyHeadsInner(query);
  at::Tensor logsumexp = at::empty({b, h, t}, query.options().dtype(at::kFloat));
  at::Tensor seed = at::empty({2}, query.options().dtype(at::kUInt64));
  at::Tensor offset = at::empty({}, query.options().dtype(at::kUInt64));
  at::Tensor debug = at::empty({0}, query.options());
  return {std::move(output), std::move(logsumexp), at::Tensor(),
          at::Tensor(),      c10::SymInt(t),       c10::SymInt(key.size(2)),
          std::move(seed),   std::move(offset),    std::move(debug)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> CudaFlashAttentionBackwardMeta(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& /*out*/, const at::Tensor& /*logsumexp*/,
    const at::Tensor& /*cum_seq_q*/, const at::Tensor& /*cum_seq_k*/,
    c10::SymInt /*max_q*/, c10::SymInt /*max_k*/, double /*dropout_p*/,
    bool /*is_causal*/, const at::Tensor& /*philox_seed*/,
    const at::Tensor& /*philox_offset*/, std::optional<double> /*scale*/) {
  if (!grad_out.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
  return {at::empty_like(query), at::empty_like(key), at::empty_like(value)};
}

// CUDA's memory-efficient attention (float32, or with a mask): the output in
// [B, T, H, D] memory seen as [B, H, T, D], the float32 log-sum-exp
// [B, H, T rounded up to 32] when asked for (training) and [B, H, 0]
// otherwise, and a seed and an offset (int64 scalars). Backward: gradients
// in [B, T, H, D] memory, as the inputs' shapes; no bias gradient.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> CudaEfficientAttentionMeta(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& /*attn_bias*/, bool compute_log_sumexp,
    double /*dropout_p*/, bool /*is_causal*/, std::optional<double> /*scale*/) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4,
              "_scaled_dot_product_efficient_attention: expected 4-D query, key, value");
  const int64_t b = query.size(0), h = query.size(1), t = query.size(2);
  constexpr int64_t kAlign = 32;
  at::Tensor output =
      at::empty({b, t, h, value.size(3)}, query.options()).transpose(1, 2);
  at::Tensor logsumexp =
      at::empty({b, h, compute_log_sumexp ? (t + kAlign - 1) / kAlign * kAlign : 0},
                query.options().dtype(at::kFloat));
  at::Tensor seed = at::empty({}, query.options().dtype(at::kLong));
  at::Tensor offset = at::empty({}, query.options().dtype(at::kLong));
  return {std::move(output), std::move(logsumexp), std::move(seed), std::move(offset)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
CudaEfficientAttentionBackwardMeta(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& /*attn_bias*/, const at::Tensor& /*out*/,
    const at::Tensor& /*logsumexp*/, const at::Tensor& /*philox_seed*/,
    const at::Tensor& /*philox_offset*/, double /*dropout_p*/,
    std::array<bool, 4> /*grad_input_mask*/, bool /*is_causal*/,
    std::optional<double> /*scale*/) {
  if (!grad_out.defined())
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  return {EmptyHeadsInner(query), EmptyHeadsInner(key), EmptyHeadsInner(value),
          at::Tensor()};
}

void FusedAdamWMeta(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                    at::TensorList state_steps, double /*lr*/, double /*beta1*/,
                    double /*beta2*/, double /*weight_decay*/, double /*eps*/,
                    bool amsgrad, bool /*maximize*/,
                    const std::optional<at::Tensor>& /*grad_scale*/,
                    const std::optional<at::Tensor>& /*found_inf*/) {
  // In place: no outputs to allocate, only the lists to check as the CPU
  // kernel does.
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                  state_steps.size() == n,
              "_fused_adamw_: params, grads, exp_avgs, exp_avg_sqs and state_steps must "
              "have the same length");
  TORCH_CHECK(!amsgrad || max_exp_avg_sqs.size() == n,
              "_fused_adamw_: amsgrad needs one max_exp_avg_sq per param");
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(grads[i].sizes() == params[i].sizes() &&
                    exp_avgs[i].sizes() == params[i].sizes() &&
                    exp_avg_sqs[i].sizes() == params[i].sizes(),
                "_fused_adamw_: param ", i, " of shape ", params[i].sizes(),
                " does not match its grad or state");
  }
}

// The ops above, by schema name, for RegisterMetaKernels' check.
constexpr const char* kOps[][2] = {
    {"aten::index_select", ""},
    {"aten::embedding_dense_backward", ""},
    {"aten::where", "self"},
    {"aten::where", "self_out"},
    {"aten::_fused_adamw_", ""},
    {"aten::logical_not", "out"},
    {"aten::abs", "out"},
    {"aten::logical_and", "out"},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", ""},
    {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", ""},
    {"aten::_scaled_dot_product_flash_attention", ""},
    {"aten::_scaled_dot_product_flash_attention_backward", ""},
    {"aten::_scaled_dot_product_efficient_attention", ""},
    {"aten::_scaled_dot_product_efficient_attention_backward", ""},
};

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("index_select", TORCH_FN(IndexSelectMeta));
  m.impl("embedding_dense_backward", TORCH_FN(EmbeddingDenseBackwardMeta));
  m.impl("where.self", TORCH_FN(WhereSelfMeta));
  m.impl("where.self_out", TORCH_FN(WhereSelfOutMeta));
  m.impl("_fused_adamw_", TORCH_FN(FusedAdamWMeta));
  m.impl("logical_not.out", TORCH_FN(UnaryOutMeta));
  m.impl("abs.out", TORCH_FN(UnaryOutMeta));
  m.impl("logical_and.out", TORCH_FN(BinaryOutMeta));
  m.impl("_scaled_dot_product_flash_attention_for_cpu",
         TORCH_FN(FlashAttentionForCpuMeta));
  m.impl("_scaled_dot_product_flash_attention_for_cpu_backward",
         TORCH_FN(FlashAttentionForCpuBackwardMeta));
  m.impl("_scaled_dot_product_flash_attention", TORCH_FN(CudaFlashAttentionMeta));
  m.impl("_scaled_dot_product_flash_attention_backward",
         TORCH_FN(CudaFlashAttentionBackwardMeta));
  m.impl("_scaled_dot_product_efficient_attention", TORCH_FN(CudaEfficientAttentionMeta));
  m.impl("_scaled_dot_product_efficient_attention_backward",
         TORCH_FN(CudaEfficientAttentionBackwardMeta));
}

absl::Status RegisterMetaKernels() {
  for (const auto& [name, overload] : kOps) {
    std::optional<c10::OperatorHandle> op =
        c10::Dispatcher::singleton().findSchema({name, overload});
    if (!op.has_value() || !op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
      return absl::InternalError(absl::StrCat(
          "no Meta kernel for ", name, *overload ? "." : "", overload,
          " after registration: rebuild memprofd_plan against this LibTorch"));
    }
  }
  return absl::OkStatus();
}

}  // namespace memprofd::plan
